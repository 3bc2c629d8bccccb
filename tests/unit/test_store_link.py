"""StoreLink's background open, on a real SQLite file: who waits for it, and where its errors surface."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from fastrecover import hooks
from fastrecover.committer import StoreLink
from fastrecover.errors import SchemaBehindError
from fastrecover.store import open_store
from fastrecover.store.models import VERSION_TABLE
from fastrecover_tools.testing.waiting import wait_for


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    release = threading.Event()

    def hold() -> None:
        release.wait(30)

    hooks.register("store-open", hold)
    try:
        yield release
    finally:
        release.set()
        hooks.clear()


def _link(url: str) -> StoreLink:
    return StoreLink(url, True, 1.0, 1000, 1000)


def test_the_open_runs_on_its_thread_and_get_waits_for_it(tmp_path: Path, gate: threading.Event) -> None:
    link = _link(f"sqlite:///{tmp_path / 'ranges.db'}")
    link.open_in_background()
    try:
        assert link.opening and not link.open_ended
        threading.Timer(0.2, gate.set).start()
        store = link.get()  # waits (bounded) for the open
        assert store is not None and not link.opening
        assert link.get() is store
    finally:
        link.close()


def test_what_the_open_raised_reaches_the_caller_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ranges.db'}"
    open_store(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # the unversioned schema of an older fastrecover
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
    engine.dispose()
    link = _link(url)
    link.open_in_background()
    try:
        with pytest.raises(SchemaBehindError, match="fastrecover db upgrade"):
            link.get()
        assert not link.open_ended
    finally:
        link.close()


def test_close_during_the_open_waits_for_it(tmp_path: Path, gate: threading.Event) -> None:
    link = _link(f"sqlite:///{tmp_path / 'ranges.db'}")
    link.open_in_background()
    threading.Timer(0.2, gate.set).start()
    link.close()
    assert not link.opening and link.get(force=True) is not None  # a new open after close works
    link.close()


def test_a_deferred_open_waits_for_open_soon(tmp_path: Path, store_opens: list[float]) -> None:
    link = _link(f"sqlite:///{tmp_path / 'ranges.db'}")
    link.open_in_background(defer_s=60.0)
    try:
        assert link.opening and not link.open_ended, "a deferred open counts as an open under way"
        asked = time.monotonic()
        link.open_soon(0.1)
        wait_for(lambda: not link.opening, 30, 0.005, "the deferred open to end")
        assert len(store_opens) == 1 and store_opens[0] >= asked + 0.1, "it began when open_soon said, not before"
        store = link.get()
        assert store is not None and link.get() is store
    finally:
        link.close()


def test_get_begins_a_deferred_open_at_once_and_waits_for_it(tmp_path: Path, store_opens: list[float]) -> None:
    link = _link(f"sqlite:///{tmp_path / 'ranges.db'}")
    link.open_in_background(defer_s=60.0)
    try:
        assert not store_opens
        assert link.get() is not None, "whoever needs the store gets it, deferred or not"
        assert len(store_opens) == 1 and not link.opening
    finally:
        link.close()


def test_a_deferred_open_begins_by_itself_once_its_bound_passes(tmp_path: Path, store_opens: list[float]) -> None:
    link = _link(f"sqlite:///{tmp_path / 'ranges.db'}")
    started = time.monotonic()
    link.open_in_background(defer_s=0.3)
    try:
        wait_for(lambda: not link.opening, 30, 0.005, "the deferred open to end without being asked")
        assert len(store_opens) == 1 and store_opens[0] >= started + 0.3
        assert link.get() is not None
    finally:
        link.close()


def test_close_before_a_deferred_open_began_opens_nothing(tmp_path: Path, store_opens: list[float]) -> None:
    path = tmp_path / "ranges.db"
    link = _link(f"sqlite:///{path}")
    link.open_in_background(defer_s=60.0)
    began = time.monotonic()
    link.close()
    assert time.monotonic() - began < 5.0, "close did not wait for the deferral"
    assert not link.opening and not store_opens and not path.exists(), "the store was never opened (nor created)"
    assert link.get(force=True) is not None  # a later open still works
    link.close()


def test_postpone_moves_a_deferred_open_later_but_never_past_its_bound(
    tmp_path: Path, store_opens: list[float]
) -> None:
    link = _link(f"sqlite:///{tmp_path / 'ranges.db'}")
    started = time.monotonic()
    link.open_in_background(defer_s=0.6)
    try:
        link.open_soon(0.05)  # what a recovery that replayed asks
        link.postpone(0.3)  # a tick that saw the replay still running
        link.postpone(60.0)  # ... and one that would hold it far past the bound
        wait_for(lambda: not link.opening, 30, 0.005, "the postponed open to end")
        assert len(store_opens) == 1
        assert store_opens[0] >= started + 0.3, "it began after the postponement, not when open_soon said"
        assert store_opens[0] < started + 0.6 + 2.0, "it began at the deferral's bound, not 60 s on"
        assert store_opens[0] >= started + 0.6 - 0.01, "held to the bound by the last postponement"
    finally:
        link.close()


def test_postpone_has_no_effect_once_the_store_is_wanted_now(tmp_path: Path, store_opens: list[float]) -> None:
    link = _link(f"sqlite:///{tmp_path / 'ranges.db'}")
    link.open_in_background(defer_s=60.0)
    try:
        asked = time.monotonic()
        link.open_soon(0.0)  # a jump's ranges need the store at once
        link.postpone(30.0)
        wait_for(lambda: not link.opening, 30, 0.005, "the wanted open to end")
        assert len(store_opens) == 1 and store_opens[0] < asked + 5.0, "not held by the postponement"
    finally:
        link.close()


def test_an_unavailable_store_is_reported_once_per_outage_not_per_try(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long outage logs one warning, then one a minute with the count; the store answering again says so once."""
    missing = tmp_path / "not-yet"
    link = StoreLink(f"sqlite:///{missing}/ranges.db", True, 0.0, 1000, 1000)
    caplog.set_level("DEBUG", logger="fastrecover")
    tries = 5
    for _ in range(tries):
        assert link.get(force=True) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "range store unavailable" in warnings[0], warnings
    assert sum("still unavailable" in r.getMessage() for r in caplog.records if r.levelname == "DEBUG") == tries - 1

    monkeypatch.setattr("fastrecover.store_link.REPEAT_WARNING_S", 0.0)  # a minute has passed at every try
    caplog.clear()
    assert link.get(force=True) is None
    (repeat,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert re.search(rf"still unavailable after \d+ s and {tries + 1} failed opens", repeat), repeat

    missing.mkdir()
    caplog.clear()
    try:
        assert link.get(force=True) is not None
        (back,) = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
        assert re.search(rf"after \d+ s and {tries + 1} failed opens", back), back
        caplog.clear()
        assert link.get(force=True) is not None
        assert not [r for r in caplog.records if "answers again" in r.getMessage()], "said once, not at every get()"
    finally:
        link.close()
