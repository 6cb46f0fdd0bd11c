"""The flow tools' pure shapes: the session matrix, declared outputs, a question's answer schema,
and what a finish records."""

from __future__ import annotations

import pytest
from salvor.protocol import (
    BadQuestion,
    DeclaredOutput,
    FlowTool,
    RunState,
    SchemaViolation,
    Session,
    check_finish,
    finish_schema,
    is_finish_result,
    offered_flow_tools,
    parse_inputs,
    parse_outputs,
    question_schema,
    run_result,
    text_result,
    validate,
)

ALL = list(FlowTool)


@pytest.mark.parametrize(
    ("session", "edit_mode", "seen"),
    [
        (Session.MAIN, False, ["ask_user", "subagent", "flow_results"]),
        (
            Session.MAIN,
            True,
            ["ask_user", "subagent", "flow_results", "flow_agents", "flow_write", "attach_tool"],
        ),
        (Session.CHILD, False, ["ask_user", "finish"]),
        (Session.CHILD, True, ["ask_user", "finish"]),
    ],
)
def test_the_matrix_decides_what_a_session_sees(session, edit_mode, seen):
    assert offered_flow_tools(ALL, session, edit_mode=edit_mode) == seen


@pytest.mark.parametrize(
    ("session", "edit_mode", "seen"),
    [
        (Session.CHILD, False, ["ask_user", "finish"]),
        (Session.CHILD, True, ["ask_user", "finish", "flow_agents", "flow_write"]),
        (
            Session.MAIN,
            True,
            ["ask_user", "subagent", "flow_results", "flow_agents", "flow_write", "attach_tool"],
        ),
    ],
)
def test_a_linked_tree_offers_authoring_to_its_child_sessions_in_edit_mode(
    session, edit_mode, seen
):
    assert offered_flow_tools(ALL, session, edit_mode=edit_mode, linked=True) == seen


def test_a_run_sees_only_what_its_agent_opted_into():
    opted = [FlowTool.FINISH, FlowTool.SUBAGENT]
    assert offered_flow_tools(opted, Session.MAIN, edit_mode=True) == ["subagent"]
    assert offered_flow_tools(opted, Session.CHILD, edit_mode=True) == ["finish"]


def test_outputs_parse_from_names_and_tables():
    outputs = parse_outputs(
        ["title", {"name": "score", "type": "number", "required": False, "description": "0-1"}]
    )
    assert outputs == (
        DeclaredOutput("title"),
        DeclaredOutput("score", "number", "0-1", False),
    )
    assert [i.name for i in parse_inputs(["topic", {"name": "tone"}])] == ["topic", "tone"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("title", "must be an array"),
        ([{"name": "x", "type": "date"}], "`type` must be one of"),
        (["status"], "finish uses for itself"),
        (["a", "a"], "names 'a' twice"),
        (["9lives"], "needs a name"),
        ([{"name": "x", "colour": "red"}], "must be a name or a table"),
        ([{"name": "x", "required": "yes"}], "`required` must be true or false"),
        ([{"name": "x", "description": None}], "`description` must be a string"),
    ],
)
def test_bad_outputs_are_refused_in_one_sentence(value, says):
    with pytest.raises(ValueError, match=says):
        parse_outputs(value)


@pytest.mark.parametrize(
    ("question", "good", "bad"),
    [
        ({"question": "Name?", "type": "input"}, "Ada", 3),
        ({"question": "Ship?", "type": "confirm"}, True, "yes"),
        ({"question": "Size?", "type": "select", "options": ["S", "M"]}, "M", "XL"),
        (
            {"question": "Sizes?", "type": "select", "options": ["S", "M"], "multiSelect": True},
            ["S", "M"],
            ["S", "S"],
        ),
        (
            {"question": "Size?", "type": "select", "options": ["S"], "allowCustom": True},
            "a custom size",
            ["S"],
        ),
    ],
)
def test_a_question_types_its_answer(question, good, bad):
    schema = question_schema(question)
    validate(schema, {"answer": good})
    with pytest.raises(SchemaViolation):
        validate(schema, {"answer": bad})
    with pytest.raises(SchemaViolation):
        validate(schema, {})


def test_an_input_question_carries_its_default():
    schema = question_schema({"question": "Title?", "type": "input", "defaultValue": "Untitled"})
    assert schema["properties"]["answer"]["default"] == "Untitled"


@pytest.mark.parametrize(
    ("question", "says"),
    [
        ({"question": "Pick", "type": "select"}, "needs `options`"),
        ({"question": "Pick", "type": "select", "options": ["a", "a"]}, "twice"),
        ({"question": "Ok?", "type": "confirm", "options": ["a"]}, "belongs to a select"),
        ({"question": "Pick", "type": "select", "options": ["a"], "defaultValue": "a"}, "input"),
        ({"question": "", "type": "input"}, "ask_user call"),
        ({"question": "Ok?", "type": "radio"}, "ask_user call"),
        ({"question": "Ok?", "type": "input", "colour": 1}, "ask_user call"),
    ],
)
def test_a_question_that_asks_nothing_answerable_is_refused(question, says):
    with pytest.raises(BadQuestion, match=says):
        question_schema(question)


OUTPUTS = parse_outputs([{"name": "score", "type": "number"}, {"name": "notes", "required": False}])


def test_finish_records_typed_outputs_apart_from_status_and_summary():
    result = check_finish({"status": "complete", "summary": "done", "score": 0.5}, OUTPUTS)
    assert result == {"status": "complete", "summary": "done", "outputs": {"score": 0.5}}
    assert is_finish_result(result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"status": "complete", "summary": "done"}, "needs the output `score`"),
        ({"status": "complete", "summary": "done", "score": "high"}, "score"),
        ({"status": "finished", "summary": "done", "score": 1}, "status"),
        ({"status": "complete", "score": 1}, "summary"),
        ({"status": "complete", "summary": "d", "score": 1, "extra": 2}, "extra"),
    ],
)
def test_finish_refuses_what_its_schema_does_not_describe(args, says):
    with pytest.raises(SchemaViolation, match=says):
        check_finish(args, OUTPUTS)


def test_an_unfinished_status_may_leave_outputs_out():
    assert check_finish({"status": "blocked", "summary": "no access"}, OUTPUTS)["outputs"] == {}


def test_a_decision_step_must_name_one_of_its_branches():
    branches = ["approve", "reject"]
    assert finish_schema(OUTPUTS, branches)["required"] == ["status", "summary", "branch"]
    args = {"status": "complete", "summary": "ok", "score": 1, "branch": "approve"}
    assert check_finish(args, OUTPUTS, branches)["branch"] == "approve"
    with pytest.raises(SchemaViolation, match="branch"):
        check_finish({**args, "branch": "maybe"}, OUTPUTS, branches)
    with pytest.raises(SchemaViolation, match="branch"):
        check_finish({k: v for k, v in args.items() if k != "branch"}, OUTPUTS, branches)


def test_a_text_answer_is_a_complete_result_without_outputs():
    assert text_result("all done") == {"status": "complete", "summary": "all done", "outputs": {}}
    assert not is_finish_result({"status": "complete"})


FINISHED = {"status": "blocked", "summary": "two of three", "outputs": {"n": "2"}, "branch": "b"}


@pytest.mark.parametrize(
    ("state", "detail", "result"),
    [
        # A finish result is the result as it was recorded, its branch with it.
        (RunState.COMPLETED, {"output": FINISHED}, FINISHED),
        (RunState.COMPLETED, {"output": "all done"}, text_result("all done")),
        # Any other output reads as its JSON text, keys sorted, so one output reads one way.
        (RunState.COMPLETED, {"output": {"b": 1, "a": [2]}}, text_result('{"a": [2], "b": 1}')),
        (RunState.COMPLETED, {"output": None}, text_result("null")),
        (RunState.COMPLETED, {"output": ["größe", 1.5]}, text_result('["größe", 1.5]')),
        # A dict short of a finish result's shape is output like any other.
        (
            RunState.COMPLETED,
            {"output": {"status": "done", "summary": "x", "outputs": {}}},
            text_result('{"outputs": {}, "status": "done", "summary": "x"}'),
        ),
        (
            RunState.FAILED,
            {"error": "the model refused", "code": "x"},
            {"status": "error", "summary": "the model refused", "outputs": {}},
        ),
        (
            RunState.ABANDONED,
            {"reason": "its parent run r was abandoned"},
            {"status": "error", "summary": "its parent run r was abandoned", "outputs": {}},
        ),
        (RunState.ABANDONED, {}, {"status": "error", "summary": "abandoned", "outputs": {}}),
        (RunState.FAILED, {"error": None}, {"status": "error", "summary": "failed", "outputs": {}}),
    ],
)
def test_a_finished_runs_result(state, detail, result) -> None:
    assert run_result(state, detail) == result


@pytest.mark.parametrize(
    "state", sorted(set(RunState) - {RunState.COMPLETED, RunState.FAILED, RunState.ABANDONED})
)
def test_a_run_that_has_not_ended_has_no_result(state) -> None:
    assert run_result(state, {"output": FINISHED, "error": "x"}) is None


def test_a_result_is_a_copy_the_caller_may_extend() -> None:
    output = dict(FINISHED)
    run_result(RunState.COMPLETED, {"output": output})["usage"] = {}
    assert output == FINISHED
