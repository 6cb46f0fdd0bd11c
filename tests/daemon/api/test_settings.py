"""Edit mode over HTTP (``GET``/``PUT /v1/settings/edit-mode``) and from ``salvor edit-mode``,
on both backends: off by default, behind the bearer token, every refusal the one envelope with
nothing changed, and one value for the daemon, the command line beside it and the next daemon.

Every status the document lists for the path is reached here, and each answer and each request
body the daemon took is checked against the served document (``tests.support.contract``).
"""

from __future__ import annotations

import os

import trio

from tests.support.api import assert_error
from tests.support.api_server import TOKEN
from tests.support.cli import salvor_in_process
from tests.support.contract import OVERSIZED, SETTINGS_PATHS, Contract

EDIT_MODE = "/v1/settings/edit-mode"
JSON_BODY = {"Content-Type": "application/json"}


async def test_edit_mode_is_off_until_put_and_refusals_change_nothing(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call

    assert await call(api, "GET", EDIT_MODE, expect=200) == {"enabled": False}
    assert await call(api, "PUT", EDIT_MODE, expect=200, json={"enabled": True}) == {
        "enabled": True
    }
    assert await call(api, "GET", EDIT_MODE, expect=200) == {"enabled": True}

    for refused in (
        {"json": {"enabled": "off"}},
        {"json": {"enabled": 0}},
        {"json": {"enabled": None}},
        {"json": {}},
        {"json": {"enabled": False, "for": "everyone"}},
        {"json": [False]},
        {"content": b'{"enabled": fals', "headers": JSON_BODY},
    ):
        response = await api.put(EDIT_MODE, **refused)
        assert_error(response, 400, "bad_request")
        await call(api, "PUT", EDIT_MODE, expect=400, **refused)
        assert await call(api, "GET", EDIT_MODE, expect=200) == {"enabled": True}, refused
    await call(api, "PUT", EDIT_MODE, expect=413, content=OVERSIZED, headers=JSON_BODY)
    # A body not sent as JSON is not read as JSON.
    plain = {"content": b'{"enabled": false}', "headers": {"Content-Type": "text/plain"}}
    assert_error(await api.put(EDIT_MODE, **plain), 415, "unsupported_media_type")
    assert await call(api, "GET", EDIT_MODE, expect=200) == {"enabled": True}

    anonymous = server.new_client()
    await call(anonymous, "GET", EDIT_MODE, expect=401)
    await call(anonymous, "PUT", EDIT_MODE, expect=401, json={"enabled": False})
    assert await call(api, "GET", EDIT_MODE, expect=200) == {"enabled": True}

    assert await call(api, "PUT", EDIT_MODE, expect=200, json={"enabled": False}) == {
        "enabled": False
    }
    assert await call(api, "GET", EDIT_MODE, expect=200) == {"enabled": False}

    unreached = {seen for seen in contract.unreached() if seen[0] in SETTINGS_PATHS}
    assert not unreached, f"documented but never answered: {sorted(unreached)}"
    assert (EDIT_MODE, "put") in contract.requests


async def _salvor(*args: str, store_url: str):
    env = {**os.environ, "SALVOR_STORE": store_url}
    return await trio.to_thread.run_sync(lambda: salvor_in_process(*args, env=env))


async def test_one_value_for_the_daemon_the_command_line_and_the_next_daemon(
    server_factory, store_url
) -> None:
    server = await server_factory()
    response = await server.client.put(EDIT_MODE, json={"enabled": True})
    assert response.status_code == 200, response.text

    # The command line beside the live daemon reads and writes the same row.
    shown = await _salvor("edit-mode", store_url=store_url)
    assert (shown.returncode, shown.stdout, shown.stderr) == (0, "edit mode is on\n", "")
    turned = await _salvor("edit-mode", "off", store_url=store_url)
    assert (turned.returncode, turned.stdout) == (0, "edit mode is off\n")
    assert (await server.client.get(EDIT_MODE)).json() == {"enabled": False}
    turned = await _salvor("edit-mode", "on", store_url=store_url)
    assert (await server.client.get(EDIT_MODE)).json() == {"enabled": True}

    await server.stop()
    restarted = await server_factory()
    assert (await restarted.client.get(EDIT_MODE)).json() == {"enabled": True}
