"""Shared fixtures: a real Kafka broker and real stores (SQLite file, PostgreSQL).

The fixtures live in tests/fixtures/ (one module per external system) and are
re-exported here so every suite sees them.
"""

from tests.fixtures.broker import *  # noqa: F403
from tests.fixtures.stores import *  # noqa: F403
