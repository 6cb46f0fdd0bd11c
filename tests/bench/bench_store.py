"""The store a benchmark runs against (``--store URL``), and the raw baseline on that database.

Without ``--store`` a benchmark uses a fresh SQLite file in its scratch
directory, as before. With a ``postgresql://`` URL it creates a schema of its
own on that server (named ``salvor_bench_<hex>``, reached through
``options=-csearch_path%3D<schema>`` in the URL, as the test fixtures do) and
drops it at the end, so two runs never see each other's rows.

On PostgreSQL the raw baseline is the same database's own rate, through
psycopg: one ``INSERT`` + ``COMMIT`` per row, and ``per_txn`` rows per
transaction (``executemany``) for the batched rate. Not a benchmark itself.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from salvor.store import normalize_store_url

RAW_TABLE = "CREATE TABLE raw (run_id TEXT, seq BIGINT, payload TEXT, PRIMARY KEY (run_id, seq))"


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="a postgresql:// URL (the bench makes and drops a schema of its own there); "
        "default: a fresh SQLite file in the scratch directory",
    )


def is_postgres(url: str) -> bool:
    return normalize_store_url(url).startswith("postgresql")


def conninfo(url: str) -> str:
    """A libpq URL psycopg accepts (the SQLAlchemy driver suffix removed)."""
    return normalize_store_url(url).replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def bench_store_url(store: str | None, scratch: Path, name: str = "salvor.db") -> Iterator[str]:
    """The URL of a new, empty store: ``scratch/name`` on SQLite, a fresh schema on PostgreSQL."""
    if store is None:
        yield "sqlite:///" + str(scratch / name)
        return
    if not is_postgres(store):
        raise SystemExit(f"--store takes a postgresql:// URL (got {store!r}); omit it for SQLite")
    import psycopg

    schema = f"salvor_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo(store), autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in store else "?"
    try:
        yield f"{store}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(conninfo(store), autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def _raw_table(url: str):
    import psycopg

    connection = psycopg.connect(conninfo(url), autocommit=True, connect_timeout=5)
    try:
        connection.execute("DROP TABLE IF EXISTS raw")
        connection.execute(RAW_TABLE)
        yield connection
    finally:
        try:
            connection.execute("DROP TABLE IF EXISTS raw")
        finally:
            connection.close()


def raw_pg_commits_per_s(url: str, rows: int, payload: str) -> float:
    """One ``BEGIN; INSERT; COMMIT`` per row on the store's own database (in its schema)."""
    with _raw_table(url) as connection:
        start = time.perf_counter()
        for seq in range(rows):
            with connection.transaction():
                connection.execute(
                    "INSERT INTO raw (run_id, seq, payload) VALUES (%s, %s, %s)",
                    ("raw", seq, payload),
                )
        return rows / (time.perf_counter() - start)


def raw_pg_batched_rows_per_s(url: str, rows: int, per_txn: int, payload: str) -> float:
    """``per_txn`` rows per transaction (``executemany``) on the store's own database."""
    with _raw_table(url) as connection:
        start = time.perf_counter()
        for first in range(0, rows, per_txn):
            with connection.transaction(), connection.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO raw (run_id, seq, payload) VALUES (%s, %s, %s)",
                    [
                        (f"run-{n % 1000}", n, payload)
                        for n in range(first, min(rows, first + per_txn))
                    ],
                )
        return rows / (time.perf_counter() - start)


def pg_settings(url: str) -> dict:
    """The server facts a reader needs beside a PostgreSQL figure (version, durability settings)."""
    import psycopg

    with psycopg.connect(conninfo(url), autocommit=True, connect_timeout=5) as connection:
        return {
            name: connection.execute(f"SHOW {name}").fetchone()[0]
            for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
        }
