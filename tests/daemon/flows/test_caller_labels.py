"""The one check of caller-supplied labels: the bounds, the daemon's own flow labels refused,
``salvor.autonomous`` only "true" or "false" — and the daemon's own heads untouched by it."""

from __future__ import annotations

import pytest
from salvor.daemon.flows import (
    AUTONOMOUS_LABEL,
    DAEMON_LABELS,
    MAP_OF_LABEL,
    PARENT_LABEL,
    caller_labels,
)
from salvor.daemon.recording import checked_labels
from salvor.daemon.web import OperationRefused
from salvor.protocol import ErrorCode, RunStarted, check_labels


@pytest.mark.parametrize(
    "labels",
    [None, {}, {"team": "a"}, {AUTONOMOUS_LABEL: "true"}, {AUTONOMOUS_LABEL: "false", "x": "y"}],
)
def test_labels_a_caller_may_set_pass_unchanged(labels):
    assert caller_labels(labels) == labels


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (
            {PARENT_LABEL: "r"},
            (
                "events[0]: the label `salvor.parent` is written by the daemon alone (a subagent's "
                "child run names its parent with it); choose another key"
            ),
        ),
        (
            {"a": "b", MAP_OF_LABEL: "g"},
            (
                "events[0]: the label `salvor.map_of` is written by the daemon alone (a map's item "
                "run names its graph run with it); choose another key"
            ),
        ),
        (
            {AUTONOMOUS_LABEL: "1"},
            (
                'events[0]: the label `salvor.autonomous` is "true" (nobody answers questions '
                "in this run tree) or \"false\", not '1'"
            ),
        ),
        ({"": "v"}, "events[0]: label key '' must be 1 to 64 bytes"),
    ],
)
def test_a_refused_label_is_one_bad_request_sentence(labels, message):
    with pytest.raises(OperationRefused) as refused:
        caller_labels(labels, "events[0]: ")
    assert refused.value.code is ErrorCode.BAD_REQUEST
    assert refused.value.message == message


def test_the_daemons_own_heads_meet_only_the_bounds():
    # A map item's or a subagent child's head carries the daemon's labels: the guard and the
    # runtime check only the bounds, which they pass.
    own = dict.fromkeys(DAEMON_LABELS, "00000000-0000-4000-8000-000000000000")
    check_labels(own)
    assert checked_labels(own) == own
    assert RunStarted(agent_def_hash="sha256:" + "a" * 64, input=None, labels=own).labels == own
