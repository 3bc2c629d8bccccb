"""Fault 3: the child thread dies mid-range, then the whole process is SIGKILLed while the child is mid-range."""

from __future__ import annotations

import pytest

from fastrecover.store import open_store
from fastrecover.tokens import Token
from fastrecover_tools.testing.waiting import wait_for
from tests.faults.conftest import GROUP_PROTOCOLS, SCRIPTED, DriverFactory, crash_with_lag, verdict_ok

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_child_crash_and_sigkill_mid_range_resume_from_committed(
    chaos_driver: DriverFactory, group_protocol: str
) -> None:
    driver = chaos_driver(
        **SCRIPTED,
        rate=150.0,
        min_offsets=20,
        group_protocol=group_protocol,
    )
    first = crash_with_lag(driver, finished=200, lag=450)  # 150 records per partition

    # incarnation 2: its child thread raises on its 2nd batch; commits per message; SIGKILLed at its
    # 60th backfilled record, i.e. while the (restarted) child is mid-range
    second = driver.spawn(
        0,
        faults=False,
        extra=[
            "--commit",
            "message",
            "--fail-child-after",
            "2",
            "--set",
            "fastrecover.backfill.batch.size=20",
            "--stall-at",
            "backfill",
            "--stall-after",
            "60",
        ],
    )
    wait_for(lambda: second.has("stalled"), 90, 0.05, "the second incarnation to stall mid-range")
    assert second.has("child-failure-injected"), second.events[-5:]
    driver.kill(0)
    log_text = (driver.workdir / "logs" / "m1-2.log").read_text(errors="replace")
    assert "restarting it from the ranges' committed offsets" in log_text, log_text[-2000:]

    with open_store(driver.config.store_url) as store:
        snapshot: list[Token] = store.open_ranges(driver.group)
    assert snapshot, "the kill must leave ranges open"
    assert any(t.progress.committed > t.progress.start for t in snapshot), (
        f"some range must have committed progress to resume from: {[t.describe() for t in snapshot]}"
    )

    driver.spawn(0, faults=False, extra=["--commit", "sync"])
    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert first.end == "killed"

    # every range resumes at its committed offset (the first offset not already finished), not at its start
    from fastrecover_tools.chaos.checker import read_ledgers

    # the incarnations after the kill: one, or more when a KIP-848 broker fenced a restart that came
    # before it expired the killed static member (a fatal error: the worker exits and is restarted)
    later = [p for p in (driver.workdir / "ledger").glob("m1-*.ledger") if int(p.stem.split("-")[1]) >= 3]
    entries, _ = read_ledgers(later)
    for t in snapshot:
        delivered = [e.offset for e in entries if e.token == t.id]
        expected = min(
            o
            for o in range(t.progress.committed, t.progress.end + 1)
            if o == t.progress.end or o not in t.progress.completed
        )
        if expected == t.progress.end:
            continue
        assert delivered, f"range #{t.id} was not backfilled by the next incarnation"
        assert min(delivered) == expected, (t.describe(), sorted(delivered)[:5])
