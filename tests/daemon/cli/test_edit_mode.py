"""``salvor edit-mode [on|off]`` against a store, on both backends: it says the state, sets it
when told to, and a word it does not take is a usage error that changes nothing.

In-process (``tests.support.cli``): what is tested is the verb's sentence, exit and the setting
it leaves in the store.
"""

from __future__ import annotations

import json
import os

from salvor.store import EventStore, sqlite_path

from tests.support.cli import salvor_in_process


def _salvor(store_url: str, *args: str):
    return salvor_in_process(*args, env={**os.environ, "SALVOR_STORE": store_url})


def _stored(store_url: str) -> int | None:
    with EventStore.open(store_url) as store:
        return store.settings.get_setting("flows.edit_mode")


def test_edit_mode_is_said_and_set(store_url: str) -> None:
    EventStore.open(store_url).close()
    shown = _salvor(store_url, "edit-mode")
    assert (shown.returncode, shown.stdout, shown.stderr) == (0, "edit mode is off\n", "")
    assert _stored(store_url) is None  # saying it writes nothing

    turned = _salvor(store_url, "edit-mode", "on")
    assert (turned.returncode, turned.stdout) == (0, "edit mode is on\n")
    assert _stored(store_url) == 1
    again = _salvor(store_url, "edit-mode", "--json")
    assert (again.returncode, json.loads(again.stdout)) == (0, {"enabled": True})

    refused = _salvor(store_url, "edit-mode", "maybe")
    assert refused.returncode == 2 and "invalid choice: 'maybe'" in refused.stderr
    assert _stored(store_url) == 1

    turned = _salvor(store_url, "edit-mode", "off", "--json")
    assert (turned.returncode, json.loads(turned.stdout)) == (0, {"enabled": False})
    assert _stored(store_url) == 0


def test_edit_mode_creates_no_store(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'nowhere.db'}"
    refused = _salvor(url, "edit-mode", "on")
    assert refused.returncode == 1 and refused.stderr.startswith("salvor: no store at ")
    assert not sqlite_path(url).exists()
