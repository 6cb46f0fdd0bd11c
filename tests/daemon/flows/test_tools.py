"""The flow tools bound to a session: what a session is offered, and what ask_user and finish
return or refuse."""

from __future__ import annotations

import pytest
from salvor.daemon.flows import (
    AUTONOMOUS_LABEL,
    MAP_OF_LABEL,
    PARENT_LABEL,
    FlowSession,
    flow_tool,
    flow_tools,
    inherited_labels,
    is_autonomous,
    session_of,
)
from salvor.daemon.tools import Suspend, ToolCall, ToolFailed, dispatch
from salvor.protocol import Effect, FlowTool, Session, parse_outputs, validate

ALL = tuple(FlowTool)
CALL = ToolCall(run_id="r", seq=3, idempotency_key=None, attempt=1)


class _Host:
    async def edit_mode(self) -> bool:
        return False


def test_labels_decide_the_session_and_autonomy():
    assert session_of(None) is Session.MAIN
    assert session_of({PARENT_LABEL: "p"}) is Session.CHILD
    assert session_of({MAP_OF_LABEL: "g"}) is Session.CHILD
    assert session_of({}, graph_node=True) is Session.CHILD
    assert is_autonomous({AUTONOMOUS_LABEL: "true"})
    assert not is_autonomous({AUTONOMOUS_LABEL: "yes"})
    assert inherited_labels({AUTONOMOUS_LABEL: "true", "team": "x"}) == {AUTONOMOUS_LABEL: "true"}
    assert inherited_labels({"team": "x"}) == {}


def test_tools_that_need_a_host_are_not_offered_without_one():
    alone = FlowSession(run_id="r", session=Session.MAIN, opted_in=ALL)
    assert [t.name for t in flow_tools(alone, edit_mode=True)] == ["ask_user"]
    hosted = FlowSession(run_id="r", session=Session.MAIN, opted_in=ALL, host=_Host())
    names = [t.name for t in flow_tools(hosted, edit_mode=True)]
    assert names == [
        "ask_user",
        "subagent",
        "flow_results",
        "flow_agents",
        "flow_write",
        "attach_tool",
    ]
    assert {t.name: t.effect for t in flow_tools(hosted, edit_mode=False)} == {
        "ask_user": Effect.READ,
        "subagent": Effect.IDEMPOTENT,
        "flow_results": Effect.READ,
    }


async def test_ask_user_parks_on_the_questions_answer_shape():
    session = FlowSession(run_id="r", session=Session.MAIN, opted_in=ALL)
    tool = flow_tool(session, FlowTool.ASK_USER)
    question = {"question": "Which size?", "type": "select", "options": ["S", "M"]}
    outcome, _ = await dispatch(tool, question, run_id="r", seq=3, key=None)
    assert isinstance(outcome, Suspend)
    assert outcome.reason == "Which size?"
    validate(outcome.input_schema, {"answer": "M"})


@pytest.mark.parametrize("session", [Session.MAIN, Session.CHILD])
async def test_an_autonomous_tree_refuses_questions_in_its_children_only(session):
    bound = FlowSession(run_id="r", session=session, autonomous=True, opted_in=ALL)
    handler = flow_tool(bound, FlowTool.ASK_USER).handler
    question = {"question": "Go?", "type": "confirm"}
    if session is Session.MAIN:
        assert isinstance(await handler(question, CALL), Suspend)
    else:
        with pytest.raises(ToolFailed, match="autonomous") as refused:
            await handler(question, CALL)
        assert not refused.value.retryable


async def test_a_question_that_asks_nothing_answerable_is_the_calls_error():
    handler = flow_tool(FlowSession(run_id="r", session=Session.MAIN), FlowTool.ASK_USER).handler
    with pytest.raises(ToolFailed, match="needs `options`"):
        await handler({"question": "Pick", "type": "select"}, CALL)


async def test_finish_is_typed_by_the_declared_outputs():
    outputs = parse_outputs([{"name": "score", "type": "number"}])
    session = FlowSession(run_id="r", session=Session.CHILD, outputs=outputs, branches=["a", "b"])
    tool = flow_tool(session, FlowTool.FINISH)
    assert tool.input_schema["properties"]["score"] == {"type": "number"}
    result = await tool.handler(
        {"status": "complete", "summary": "ok", "score": 2, "branch": "a"}, CALL
    )
    assert result == {"status": "complete", "summary": "ok", "outputs": {"score": 2}, "branch": "a"}
    with pytest.raises(ToolFailed, match="score"):
        await tool.handler({"status": "complete", "summary": "ok", "branch": "a"}, CALL)
