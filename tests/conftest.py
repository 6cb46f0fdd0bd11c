"""Shared fixtures: a store URL per backend, and an open store on it.

The backend is a parameter of ``store_url``: ``sqlite`` (a real file in ``tmp_path``)
always, ``postgres`` when ``SALVOR_TEST_POSTGRES_URL`` names a server; a module
narrows the list with ``STORE_BACKENDS`` (``tests/support/backends.py`` says when). Each
postgres test gets a schema of its own (through ``search_path`` in the URL),
dropped afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from salvor.store import EventStore, normalize_store_url

from tests.support.backends import backends_of

POSTGRES_ENV = "SALVOR_TEST_POSTGRES_URL"
REPO = Path(__file__).resolve().parent.parent


def _postgres_schema_url(base: str) -> Iterator[str]:
    import psycopg

    conninfo = normalize_store_url(base).replace("postgresql+psycopg://", "postgresql://", 1)
    schema = f"salvor_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _names(argnames: str | list | tuple) -> list[str]:
    if isinstance(argnames, str):
        return [name.strip() for name in argnames.split(",")]
    return list(argnames)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the checkout's bytecode once, before any worker starts.

    The suite starts hundreds of real processes (daemons, the command line, agents, MCP servers),
    each importing the package and tests/support; where PYTHONDONTWRITEBYTECODE is set, as in CI's
    containers, each would compile those sources again (a quarter of a second of CPU per process,
    most of the suite's being CPU). Up-to-date files cost a stat each; an edited one is compiled
    afresh here.
    """
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller has done it
    import compileall

    for directory in ("salvor_ns", "protocol", "store", "daemon", "tests", "contrib"):
        compileall.compile_dir(REPO / directory, quiet=1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker more than the cores this process may use.

    Much of the suite waits (on a process starting, a timer, a kill's aftermath) with its core
    idle; a worker more fills those waits. Measured on two cores, with the fork server: 402 s
    with three workers, 507 s with two. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still names the count.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own reading of it
    return len(os.sched_getaffinity(0)) + 1


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that needs ``store_url`` once per backend its module names.

    A test that parametrizes ``store_url`` itself keeps its own list, and a module
    that defines its own ``store_url`` fixture its own URL.
    """
    if "store_url" not in metafunc.fixturenames or "store_url" in vars(metafunc.module):
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        if "store_url" in _names(marker.args[0]):
            return
    metafunc.parametrize("store_url", backends_of(metafunc.module), indirect=True)


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A URL for a new, empty store on the backend the test is parametrized with."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'salvor.db'}"
        return
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        pytest.skip(f"{POSTGRES_ENV} is not set; set it to a PostgreSQL URL to test that backend")
    yield from _postgres_schema_url(base)


@pytest.fixture
def store(store_url: str) -> Iterator[EventStore]:
    """An open store on ``store_url``, closed after the test."""
    opened = EventStore.open(store_url)
    try:
        yield opened
    finally:
        opened.close()
