"""What a worker of ``salvor serve --workers N`` is told by its supervisor, through its environment.

A worker is an ordinary ``salvor serve`` process started by the supervisor (``_workers``) with
the operator's own arguments; these variables make it one worker among N instead of a whole
daemon:

* ``SALVOR_WORKER_INDEX``: which worker it is (0 .. N-1), shown in ``/v1/health`` (``worker``)
  and as the ``worker`` label on ``/metrics``, so a caller can tell which one answered.
* ``SALVOR_WORKER_FDS`` (internal): ``LISTEN,LIFELINE,TALLY``, the descriptors it inherited:
  the listening socket the supervisor bound (the worker serves it instead of binding its own),
  the read end of a pipe whose other end only the supervisor holds (its end of file means the
  supervisor is gone, and the worker stops as on SIGTERM), and the workers' tally of open
  connections (``ConnectionTally``: a worker ahead of its siblings leaves new connections to
  them), which a role from an older supervisor lacks.
Every worker is a whole node otherwise: it recovers, takes over, wakes and delivers like any
daemon over a shared store, each run and each outbox row claimed by exactly one of them in the
store (issue 30's ownership and claims), so no duty needs a designated worker.

A worker takes no store lock: its supervisor holds it for the service, so a second daemon or a
``salvor resume`` beside the service is still refused.

Nothing here is a secret: the token and keys reach a worker as they reach ``salvor serve``, by
the variables and files the operator named, never on a command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..web import ConnectionTally

INDEX_VAR = "SALVOR_WORKER_INDEX"
FDS_VAR = "SALVOR_WORKER_FDS"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRole:
    """One worker's place in the service (None in a ``ServeConfig``: a whole daemon)."""

    index: int
    listen_fd: int
    lifeline_fd: int
    # The workers' connection tally (-1: none; each worker then accepts what it can).
    tally_fd: int = -1

    def environment(self) -> dict[str, str]:
        """The variables that make a ``salvor serve`` process this worker."""
        fds = f"{self.listen_fd},{self.lifeline_fd}"
        if self.tally_fd >= 0:
            fds += f",{self.tally_fd}"
        return {INDEX_VAR: str(self.index), FDS_VAR: fds}

    def connection_tally(self) -> ConnectionTally | None:
        """This worker's view of the workers' connection tally (None: its role gave none)."""
        return None if self.tally_fd < 0 else ConnectionTally(self.tally_fd, self.index)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> WorkerRole | None:
        """The role these variables give, None when they give none (a daemon of its own).

        Raises:
            ValueError: the variables are set but malformed (not a supervisor's).
        """
        if FDS_VAR not in environ:
            return None
        index, fds = environ.get(INDEX_VAR, ""), environ[FDS_VAR].split(",")
        if not index.isdigit() or len(fds) not in (2, 3) or not all(fd.isdigit() for fd in fds):
            raise ValueError(
                f"{INDEX_VAR} and {FDS_VAR} are set by salvor serve --workers for its workers "
                "only; unset them to start a daemon of its own"
            )
        tally = int(fds[2]) if len(fds) == 3 else -1
        return cls(index=int(index), listen_fd=int(fds[0]), lifeline_fd=int(fds[1]), tally_fd=tally)
