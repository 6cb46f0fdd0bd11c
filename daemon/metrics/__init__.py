"""The daemon's numbers: one Prometheus registry per daemon and the instruments in it.

Rule: every room may count into this one and it imports no other room. A daemon
owns its registry (never the library's process-wide default), so several
daemons in one interpreter (the tests) never mix their counts. Labels carry
bounded, daemon-chosen values only, never a string a caller sent.
"""

__all__: list[str] = []
