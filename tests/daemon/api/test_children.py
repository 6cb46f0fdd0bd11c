"""A run tree over HTTP: a child's status names its ``parent``, ``GET /v1/runs/{id}/children``
lists a run's children (oldest first, each a run summary), the label filter finds the same, and
abandoning the parent abandons the children that had not ended."""

from __future__ import annotations

import uuid

from salvor.daemon.flows import PARENT_LABEL
from salvor.protocol import EMPTY_VIEW, RunStarted

from tests.support.api_server import TOKEN
from tests.support.contract import CHILD_PATHS, MISSING_RUN, Contract

CHILDREN = "/v1/runs/{run_id}/children"
RUN = "/v1/runs/{run_id}"
AGENT = "sha256:" + "f" * 64


async def _head(server, labels=None) -> str:
    run_id = str(uuid.uuid4())
    head = RunStarted(agent_def_hash=AGENT, input=None, labels=labels)
    await server.state.runtime.access.append(run_id, [head], EMPTY_VIEW)
    return run_id


async def test_children_and_parent_over_http(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call
    parent = await _head(server)
    first = await _head(server, {PARENT_LABEL: parent, "team": "a"})
    second = await _head(server, {PARENT_LABEL: parent})
    grandchild = await _head(server, {PARENT_LABEL: second})

    listed = await call(api, "GET", CHILDREN, expect=200, run_id=parent)
    assert listed["run"] == parent and listed["derived"] is True
    assert [child["run"] for child in listed["children"]] == [first, second]
    assert listed["children"][0]["labels"] == {PARENT_LABEL: parent, "team": "a"}
    by_label = await call(
        api, "GET", "/v1/runs", expect=200, params={"label": f"{PARENT_LABEL}:{parent}"}
    )
    assert sorted(run["run"] for run in by_label["runs"]) == sorted([first, second])
    assert (await call(api, "GET", CHILDREN, expect=200, run_id=first))["children"] == []
    await call(api, "GET", CHILDREN, expect=404, run_id=MISSING_RUN)
    await call(api, "GET", CHILDREN, expect=400, run_id="not-a-run")
    await call(server.new_client(), "GET", CHILDREN, expect=401, run_id=parent)

    assert (await call(api, "GET", RUN, expect=200, run_id=first))["parent"] == parent
    assert "parent" not in await call(api, "GET", RUN, expect=200, run_id=parent)

    await call(
        api,
        "POST",
        "/v1/runs/{run_id}/abandon",
        expect=200,
        run_id=parent,
        json={"reason": "not needed"},
    )
    for child, its_parent in ((first, parent), (second, parent), (grandchild, second)):
        status = (await call(api, "GET", RUN, expect=200, run_id=child))["status"]
        assert status == {
            "state": "abandoned",
            "reason": f"its parent run {its_parent} was abandoned",
        }, child
    unreached = {seen for seen in contract.unreached() if seen[0] in CHILD_PATHS}
    assert not unreached, sorted(unreached)
