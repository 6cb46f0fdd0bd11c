"""form.js in a real browser: a form from each answer schema, the JSON it reads, the API's refusal.

One headless Chromium for the module, on the harness page (``harness.py``), under the page's CSP.
What the form reads is checked against the daemon's own validator, and the refusals it shows are
built by the daemon's own code from its validator's violations, so a change of wording on either
side fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from salvor.daemon.web import OperationRefused, bad_request
from salvor.protocol import (
    BUDGET_EXTENSION_SCHEMA,
    ErrorCode,
    SchemaViolation,
    question_schema,
    validate,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from tests.daemon.dashboard.harness import harness_page
from tests.support.browser import screenshot

OMITTED = object()

# Every kind the form renders, in one answer schema.
TICKET = {
    "type": "object",
    "required": ["name", "count", "kind", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 40, "title": "Name"},
        "notes": {"type": "string", "description": "Anything else the team should know"},
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number", "exclusiveMinimum": 0},
        "urgent": {"type": "boolean"},
        "kind": {"enum": ["bug", "feature", 3]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["ui", "billing", "api"]},
            "uniqueItems": True,
        },
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["title"],
                "properties": {
                    "title": {"type": "string", "maxLength": 60},
                    "minutes": {"type": "integer", "minimum": 0},
                },
            },
        },
        "owner": {
            "type": "object",
            "properties": {
                "email": {"type": "string", "maxLength": 80},
                "team": {"type": "object", "properties": {"id": {"type": "integer"}}},
            },
        },
        "extra": {"type": "object"},
    },
}
FILLED = {
    "name": "Ada",
    "count": 3,
    "ratio": 0.5,
    "urgent": True,
    "kind": "feature",
    "tags": ["ui", "api"],
    "steps": [{"title": "two", "minutes": 5}, {"title": "three"}],
    "owner": {"email": "ada@example.com"},
    "extra": {"k": [1, 2]},
}
# The publishing graph's gate (contrib/graphs/publish.json).
APPROVAL = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with harness_page(tmp_path_factory.mktemp("chromium")) as driver:
        yield driver


@pytest.fixture
def page(browser):
    """The browser with no form on the stage; after the test, no CSP refusal was recorded."""
    yield browser
    assert browser.execute_script("return window.harness.violations()") == []


def render(driver, schema: dict, initial: Any = OMITTED) -> None:
    if initial is OMITTED:
        driver.execute_script("window.harness.form(arguments[0])", json.dumps(schema))
    else:
        script = "window.harness.form(arguments[0], arguments[1])"
        driver.execute_script(script, json.dumps(schema), json.dumps(initial))


def value(driver) -> Any:
    """What the form's value() returns, as JSON (OMITTED for undefined)."""
    answer = driver.execute_script("return window.harness.value()")
    assert "json" in answer, answer
    return OMITTED if answer["json"] == "undefined" else json.loads(answer["json"])


def field(driver, pointer: str):
    return driver.find_element(By.CSS_SELECTOR, f"[data-field={json.dumps(pointer)}]")


def control(driver, pointer: str):
    """The field's own input (a leaf field has one)."""
    return field(driver, pointer).find_element(By.CSS_SELECTOR, "[data-test=input]")


def type_into(driver, pointer: str, text: str) -> None:
    box = control(driver, pointer)
    box.clear()
    box.send_keys(text)


def field_error(driver, pointer: str) -> str | None:
    """The refusal shown beside the field, None when none is shown."""
    return driver.execute_script(
        """
        const wrapper = [...document.querySelectorAll('[data-field]')]
          .find((node) => node.getAttribute('data-field') === arguments[0]);
        const slot = [...wrapper.querySelectorAll('[data-test=field-error]')]
          .find((node) => node.closest('[data-field]') === wrapper);
        return slot.hidden ? null : slot.textContent;
        """,
        pointer,
    )


def fields_shown(driver) -> dict:
    """Each field by pointer: its kind, its control's tag and type, and its required mark."""
    return driver.execute_script(
        """
        const shown = {};
        for (const wrapper of document.querySelectorAll('[data-field]')) {
          const own = (selector) => [...wrapper.querySelectorAll(selector)]
            .filter((node) => node.closest('[data-field]') === wrapper);
          const input = own('[data-test=input]')[0];
          shown[wrapper.getAttribute('data-field')] = {
            kind: wrapper.getAttribute('data-kind'),
            tag: input ? input.tagName.toLowerCase() : null,
            type: input && input.tagName === 'INPUT' ? input.type : null,
            required: own('[data-test=required]').length === 1,
          };
        }
        return shown;
        """
    )


def test_every_kind_renders_as_its_control_with_required_marks(page, tmp_path):
    render(page, TICKET)
    shown = fields_shown(page)
    rendered = {p: (s["kind"], s["tag"], s["type"], s["required"]) for p, s in shown.items()}
    assert rendered == {
        "": ("object", None, None, False),
        "/name": ("string", "input", "text", True),
        "/notes": ("string", "textarea", None, False),
        "/count": ("number", "input", "number", True),
        "/ratio": ("number", "input", "number", False),
        "/urgent": ("boolean", "input", "checkbox", False),
        "/kind": ("enum", "select", None, True),
        "/tags": ("choices", None, None, True),
        "/steps": ("array", None, None, False),
        "/owner": ("object", None, None, False),
        "/owner/email": ("string", "input", "text", False),
        "/owner/team": ("object", None, None, False),
        "/owner/team/id": ("number", "input", "number", False),
        "/extra": ("json", "textarea", None, False),
    }
    count = control(page, "/count")
    assert (count.get_attribute("step"), count.get_attribute("min")) == ("1", "1")
    assert count.get_attribute("max") == "10"
    assert control(page, "/ratio").get_attribute("step") == "any"
    options = [o.text for o in Select(control(page, "/kind")).options]
    assert options == ["— choose —", "bug", "feature", "3"]
    choices = field(page, "/tags").find_elements(By.CSS_SELECTOR, "[data-test=choice]")
    assert [c.find_element(By.XPATH, "../label").text for c in choices] == ["ui", "billing", "api"]
    assert field(page, "/name").find_element(By.TAG_NAME, "label").text == "Name*"
    assert "Anything else the team should know" in field(page, "/notes").text
    assert "> 0" in field(page, "/ratio").text
    screenshot(page, tmp_path, "form-kinds")


def test_value_reads_numbers_arrays_and_nested_objects_and_omits_empty_optionals(page, tmp_path):
    render(page, TICKET)
    type_into(page, "/name", "Ada")
    type_into(page, "/count", "3")
    type_into(page, "/ratio", "0.5")
    control(page, "/urgent").click()
    Select(control(page, "/kind")).select_by_visible_text("feature")
    for choice in field(page, "/tags").find_elements(By.CSS_SELECTOR, "[data-test=choice]"):
        if choice.get_attribute("value") in ("0", "2"):
            choice.click()
    steps = field(page, "/steps")
    add = steps.find_element(By.CSS_SELECTOR, "[data-test=add-item]")
    for _ in range(3):
        add.click()
    for index, title in enumerate(["one", "two", "three"]):
        type_into(page, f"/steps/{index}/title", title)
    type_into(page, "/steps/1/minutes", "5")
    steps.find_elements(By.CSS_SELECTOR, "[data-test=remove-item]")[0].click()
    # The items after the removed one moved up, and their pointers with them.
    assert control(page, "/steps/0/title").get_attribute("value") == "two"
    assert control(page, "/steps/0/minutes").get_attribute("value") == "5"
    assert not page.find_elements(By.CSS_SELECTOR, '[data-field="/steps/2"]')
    type_into(page, "/owner/email", "ada@example.com")
    type_into(page, "/extra", '{"k": [1, 2]}')
    answer = value(page)
    assert answer == FILLED
    assert type(answer["count"]) is int and type(answer["ratio"]) is float
    validate(TICKET, answer)
    screenshot(page, tmp_path, "form-filled")


def test_an_untouched_form_answers_only_what_it_cannot_leave_out(page):
    render(page, TICKET)
    # Required: a string is "", a set of choices []; a checkbox always answers. An empty number,
    # an unchosen enum and every empty optional (strings, lists, objects, JSON) are left out.
    assert value(page) == {"name": "", "urgent": False, "tags": []}


def test_initial_values_and_schema_defaults_fill_the_form(page):
    render(page, TICKET, FILLED)
    assert value(page) == FILLED
    assert len(field(page, "/steps").find_elements(By.CSS_SELECTOR, "[data-test=item]")) == 2
    render(
        page,
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "default": "Untitled"},
                "share": {"type": "number", "default": 2.5},
                "size": {"enum": ["s", "m", "l"], "default": "m"},
                "keep": {"type": "boolean", "default": True},
                "slots": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
            },
        },
    )
    # minItems starts the list at that many items; an empty integer item answers null, so the
    # daemon names the item by its index.
    assert value(page) == {
        "title": "Untitled",
        "share": 2.5,
        "size": "m",
        "keep": True,
        "slots": [None, None],
    }


QUESTIONS = [
    (
        {"question": "Title?", "type": "input", "defaultValue": "Untitled"},
        lambda page: type_into(page, "/answer", "Tides"),
        "Tides",
    ),
    (
        {"question": "Ship it?", "type": "confirm"},
        lambda page: control(page, "/answer").click(),
        True,
    ),
    (
        {"question": "Colour?", "type": "select", "options": ["red", "blue"]},
        lambda page: Select(control(page, "/answer")).select_by_visible_text("blue"),
        "blue",
    ),
    (
        {
            "question": "Colours?",
            "type": "select",
            "options": ["red", "green", "blue"],
            "multiSelect": True,
        },
        lambda page: [
            box.click()
            for box in reversed(page.find_elements(By.CSS_SELECTOR, "[data-test=choice]"))
            if box.get_attribute("value") != "1"
        ],
        ["red", "blue"],
    ),
    (
        {"question": "Colour?", "type": "select", "options": ["red", "blue"], "allowCustom": True},
        lambda page: type_into(page, "/answer", "teal"),
        "teal",
    ),
]


@pytest.mark.parametrize(
    ("question", "answer_it", "answer"),
    QUESTIONS,
    ids=["input", "confirm", "select", "multi-select", "custom"],
)
def test_each_ask_user_question_is_answered_as_the_daemon_checks_it(
    page, question, answer_it, answer
):
    schema = question_schema(question)
    render(page, schema)
    assert question["question"] in field(page, "/answer").text
    answer_it(page)
    got = value(page)
    assert got == {"answer": answer}
    validate(schema, got)


def test_a_gate_and_a_budget_form_answer_their_schemas_and_the_default_gate_takes_json(page):
    render(page, APPROVAL)
    control(page, "/approved").click()
    type_into(page, "/note", "ship it")
    assert value(page) == {"approved": True, "note": "ship it"}
    # The inbox's other form: how much more of a crossed budget to allow.
    render(page, BUDGET_EXTENSION_SCHEMA)
    type_into(page, "/extend_by", "2500")
    assert value(page) == {"extend_by": 2500}
    # A gate without an approval_schema asks for any object: JSON text, starting at {}.
    render(page, {"type": "object"})
    assert control(page, "").get_attribute("value") == "{}"
    assert value(page) == {}
    type_into(page, "", "{oops")
    refused = page.execute_script("return window.harness.value()")
    assert refused["thrown"] == "FormInputError"
    assert "not valid JSON" in page.find_element(By.CSS_SELECTOR, "[data-test=form-error]").text


def _refusal_of(schema: dict, answer: Any, gate: str | None) -> dict:
    """The envelope the daemon answers a resume with ``answer`` with (as runs/_runtime.py)."""
    try:
        validate(schema, answer, what="the resume input")
    except SchemaViolation as exc:
        if gate is not None:
            refusal = OperationRefused(
                ErrorCode.APPROVAL_SCHEMA_VIOLATION,
                f"gate {gate!r} refuses this approval: {exc.message}",
                details={"node": gate, "violations": exc.violations},
            )
        else:
            refusal = bad_request(exc.message, details={"violations": exc.violations})
        return refusal.to_json()
    raise AssertionError(f"{answer!r} satisfies the schema")


def show_errors(driver, envelope: dict) -> None:
    driver.execute_script("window.harness.showErrors(arguments[0])", json.dumps(envelope))


def form_error(driver) -> str:
    shown = driver.find_element(By.CSS_SELECTOR, "[data-test=form-error]")
    assert shown.is_displayed()
    return shown.text


def test_show_errors_puts_the_message_beside_the_form_and_the_field_it_names(page, tmp_path):
    render(page, TICKET, FILLED)
    type_into(page, "/count", "12")
    envelope = _refusal_of(TICKET, value(page), gate="approve")
    show_errors(page, envelope)
    assert form_error(page) == envelope["error"]["message"]
    assert field_error(page, "/count") == "must be smaller than or equal to 10"
    assert field_error(page, "/name") is None and field_error(page, "") is None
    screenshot(page, tmp_path, "form-refused")
    # Editing the field takes its refusal away; the form's message stays until the next answer.
    control(page, "/count").send_keys(Keys.BACKSPACE)
    assert field_error(page, "/count") is None
    assert form_error(page) == envelope["error"]["message"]


def test_a_refusal_about_a_list_item_finds_it_after_an_item_before_it_was_removed(page):
    render(page, TICKET, {**FILLED, "steps": [{"title": "one"}, {"title": "two"}]})
    type_into(page, "/steps/1/minutes", "-1")
    field(page, "/steps").find_elements(By.CSS_SELECTOR, "[data-test=remove-item]")[0].click()
    envelope = _refusal_of(TICKET, value(page), gate=None)
    assert envelope["error"]["details"]["violations"][0]["path"] == "$.steps[0].minutes"
    show_errors(page, envelope)
    assert field_error(page, "/steps/0/minutes") == "must be bigger than or equal to 0"
    assert field_error(page, "/steps/0") is None


def test_a_message_without_details_still_names_its_field(page):
    render(page, TICKET)
    envelope = _refusal_of(TICKET, value(page), gate=None)
    del envelope["error"]["details"]
    # "... $ must contain ['count', 'kind'] properties" (the required fields left empty).
    show_errors(page, envelope)
    assert form_error(page) == envelope["error"]["message"]
    missing = {p for p in ("/count", "/kind", "/name", "/tags") if field_error(page, p)}
    assert missing == {"/count", "/kind"}
    assert field_error(page, "/count") == "required"
    # A second refusal replaces the first, field errors included.
    type_into(page, "/count", "0")
    show_errors(
        page,
        {
            "error": {
                "code": "bad_request",
                "message": "the resume input does not satisfy the "
                "recorded schema: $.count must be bigger than or equal to 1",
            }
        },
    )
    assert field_error(page, "/kind") is None
    assert field_error(page, "/count") == "must be bigger than or equal to 1"


def test_property_names_with_a_slash_a_dot_or_a_space_are_their_own_fields(page):
    # The pointer escapes "/" (RFC 6901); the daemon's "$.x.y" spelling cannot tell a dot in a
    # name from a level, so the form matches it against its own fields' spellings instead.
    odd = {
        "type": "object",
        "properties": {
            "a/b": {"type": "integer", "maximum": 1},
            "c.d": {"type": "object", "properties": {"e f": {"type": "integer", "maximum": 1}}},
        },
    }
    render(page, odd)
    type_into(page, "/a~1b", "2")
    type_into(page, "/c.d/e f", "3")
    assert value(page) == {"a/b": 2, "c.d": {"e f": 3}}
    envelope = _refusal_of(odd, value(page), gate=None)
    show_errors(page, envelope)
    assert field_error(page, "/a~1b") == "must be smaller than or equal to 1"
    type_into(page, "/a~1b", "1")
    show_errors(page, _refusal_of(odd, value(page), gate=None))
    assert field_error(page, "/c.d/e f") == "must be smaller than or equal to 1"
    assert field_error(page, "/c.d") is None
