"""Idempotency claims and the answers of probes of open writes (``store.claims``).

A claim is written only by an append, in the append's own transaction (``_append_rows``); this
repository reads them, and keeps the probe answers that settle what a parked write did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, tuple_

from ._append_rows import SELECT_CLAIM, now_instant
from ._errors import ClaimHeld
from ._records import Claim, ProbeAnswer, claim_from_row, probe_answer_from_row
from ._repository import Repository
from ._schema import probe_answers
from ._view_codec import dumps

_VERDICTS = frozenset({"landed", "not_landed", "unknown"})
# Pairs per query: keeps a long queue's statement within both databases' parameter limits.
_PROBE_PAGE = 400


class Claims(Repository):
    """The ``claims`` and ``probe_answers`` tables."""

    def get_claim(self, identity: str) -> Claim | None:
        with self._reading("read a claim") as connection:
            row = connection.execute(SELECT_CLAIM, {"identity": identity}).first()
        return None if row is None else claim_from_row(row)

    def held(self, identity: str) -> ClaimHeld:
        """The error an append whose ``identity`` another intent holds raises (naming the
        holder, read now; ``?`` when it is gone already)."""
        holder = self.get_claim(identity)
        run_id, seq, state = (
            (holder.run_id, holder.seq, holder.state) if holder else ("?", -1, "open")
        )
        return ClaimHeld(
            f"the idempotency identity {identity!r} is already claimed by run {run_id} "
            f"at seq {seq} ({state}); nothing was written",
            identity=identity,
            run_id=run_id,
            seq=seq,
            state=state,
        )

    def put_probe_answer(
        self,
        run_id: str,
        seq: int,
        *,
        tool: str,
        probe_input: Any,
        answer: Any,
        error: str | None,
        verdict: str,
    ) -> None:
        """Record the probe of the open write at ``seq`` of ``run_id``, replacing an earlier one.

        ``answer`` is None when the probe gave none (``error`` then says why).
        A failure leaves the earlier answer, if any, as it was.

        Raises:
            ValueError: ``verdict`` is not "landed", "not_landed" or "unknown".
            StoreUnavailable: the database failed.
        """
        if verdict not in _VERDICTS:
            raise ValueError(f"a probe's verdict is one of {sorted(_VERDICTS)}, not {verdict!r}")
        row = {
            "run_id": run_id,
            "seq": seq,
            "tool": tool,
            "input": dumps(probe_input),
            "answer": None if answer is None else dumps(answer),
            "error": error,
            "verdict": verdict,
            "observed_at": now_instant(),
        }
        self._upsert(probe_answers, row, ("run_id", "seq"), "record a probe's answer")

    def probe_answers(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], ProbeAnswer]:
        """The last probe answer of each ``(run_id, seq)`` that has one."""
        found: dict[tuple[str, int], ProbeAnswer] = {}
        pairs = list(dict.fromkeys(pairs))
        for start in range(0, len(pairs), _PROBE_PAGE):
            page = pairs[start : start + _PROBE_PAGE]
            statement = select(*probe_answers.c).where(
                tuple_(probe_answers.c.run_id, probe_answers.c.seq).in_(page)
            )
            with self._reading("read probe answers") as connection:
                for row in connection.execute(statement):
                    answer = probe_answer_from_row(row)
                    found[(answer.run_id, answer.seq)] = answer
        return found
