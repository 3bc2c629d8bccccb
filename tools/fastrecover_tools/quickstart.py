"""The README quickstart's consumer settings, besides the bootstrap servers, the group, the mode and the store.

The demo and the benchmarks run with these, for the plain client and for fastrecover alike, so that
the figures they show are the quickstart's; a docs test holds the README to them.  Static membership
(``group.instance.id``) is part of the quickstart too; each tool names its members itself.

- ``session.timeout.ms``: a member that stays down is replaced within 10 s.
- ``reconnect.backoff.ms``: librdkafka lets a handle with no broker connection up open one at most
  every max(11, this / 2) ms.  A new process meets that wait at once: the first metadata answer
  replaces the bootstrap connection with one to the broker it names, the coordinator query in
  flight on the old one fails, and with librdkafka's default (100 ms) the next connection waits
  about 50 ms.  At 20 ms the wait is 11 ms, for the plain client as for fastrecover; a broker that
  is down still sees the back-off grow to ``reconnect.backoff.max.ms``.
"""

from __future__ import annotations

from collections.abc import Mapping

QUICKSTART_SESSION_MS = 10_000
QUICKSTART_RECONNECT_BACKOFF_MS = 20

#: the settings as consumer properties (strings, as ``--set`` and the bench workers take them)
QUICKSTART: Mapping[str, str] = {
    "session.timeout.ms": str(QUICKSTART_SESSION_MS),
    "reconnect.backoff.ms": str(QUICKSTART_RECONNECT_BACKOFF_MS),
}
