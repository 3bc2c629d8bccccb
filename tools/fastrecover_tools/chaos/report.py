"""The checker's verdict as a plain-text (and Markdown-compatible) table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from fastrecover_tools.chaos.checker import Stats, Verdict
from fastrecover_tools.chaos.driver import ChaosResult


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s"


def _stats(s: Stats) -> str:
    if not s.count:
        return "-"
    return f"p50 {_ms(s.p50)}, p99 {_ms(s.p99)}, max {_ms(s.max)} (n={s.count})"


def _counter(c: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"


def verdict_rows(v: Verdict) -> list[tuple[str, str]]:
    return [
        ("records produced (acknowledged)", str(v.produced)),
        ("records finished (distinct)", str(v.finished_unique)),
        ("records lost", str(v.lost)),
        ("duplicates", f"{v.duplicates} ({100 * v.duplicate_rate:.2f}% of finished)"),
        ("deleted by retention before finished", str(v.retention_deleted_unfinished)),
        ("skipped recorded on range tokens", str(v.skipped_recorded)),
        ("deleted and not accounted for", str(v.unaccounted)),
        ("records not delivered again after a reset back", str(v.not_reread)),
        ("records a reset forward skipped (excused)", str(v.operator_skipped)),
        ("records deleted with their topic unfinished", str(v.deleted_with_topic)),
        ("longest wait produce -> finished", _ms(v.wait_ms.max)),
        ("wait produce -> finished", _stats(v.wait_ms)),
        ("time to fresh after each (re)start", _stats(v.time_to_fresh_ms)),
        ("incarnations without a fresh record", str(v.never_fresh)),
        ("ranges opened", str(v.ranges_opened)),
        ("ranges claimed again (restart or handover)", str(v.range_claims)),
        ("ranges handed over between members", str(v.ranges_handed_over)),
        ("ranges finished", str(v.ranges_finished)),
        ("ranges still open", str(v.ranges_open)),
        ("records delivered by the child (backfill)", str(v.backfilled_records)),
        ("range epochs held by two incarnations", str(v.epoch_conflicts)),
        ("ranges backfilled by two incarnations at once", str(v.concurrent_backfills)),
        ("ranges finished by a non-owner of the partition", str(v.finished_by_non_owner)),
        ("malformed ledger lines (cut by SIGKILL)", str(v.malformed_lines)),
    ]


def result_rows(r: ChaosResult) -> list[tuple[str, str]]:
    c = r.config
    return [
        ("members x kill cycles", f"{c.members} x {r.verdict.kills} kills ({len(r.incarnations)} incarnations)"),
        ("topics x partitions, rate", f"{len(r.topics)} x {c.partitions}, {c.rate:g} records/s"),
        ("commit styles (incarnations)", _counter(r.commit_modes)),
        ("read with (incarnations)", _counter(r.apis)),
        ("kills at a stall point", _counter(r.stalls)),
        ("operator actions (every one listed below)", str(len(r.operator))),
        ("stall points not reached (killed at a random time)", str(r.stalls_missed)),
        ("child threads failed on purpose", str(r.child_failures)),
        ("members frozen and let go on (past the session timeout)", f"{r.freezes} ({r.freezes_past_session})"),
        (
            "networks to Kafka frozen, processes running on (past the session timeout)",
            f"{r.net_freezes} ({r.net_freezes_past_session})",
        ),
        ("records a thawed member delivered from a range it had lost (duplicates)", str(r.verdict.zombie_deliveries)),
        ("incarnations ended by a fatal consumer error", str(r.fatal_exits)),
        ("recoveries with ranges / degraded", f"{r.recoveries} / {r.degraded_recoveries}"),
        ("commits that failed (and were retried)", _counter(r.commit_failures)),
        ("run time: chaos / drain (passes)", f"{r.chaos_seconds:.0f} s / {r.drain_seconds:.0f} s ({r.drain_passes})"),
    ]


def format_table(rows: list[tuple[str, str]], title: str = "") -> str:
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    lines = []
    if title:
        lines.append(f"| {title.ljust(width)} | {'':<{vwidth}} |")
    else:
        lines.append(f"| {'metric'.ljust(width)} | {'value'.ljust(vwidth)} |")
    lines.append(f"|{'-' * (width + 2)}|{'-' * (vwidth + 2)}|")
    lines.extend(f"| {k.ljust(width)} | {v.ljust(vwidth)} |" for k, v in rows)
    return "\n".join(lines)


def format_result(r: ChaosResult) -> str:
    v = r.verdict
    out = [format_table(verdict_rows(v) + result_rows(r))]
    status = "PASS: nothing lost" if v.ok else "FAIL: " + "; ".join(v.failures)
    out.append("")
    out.append(f"verdict: {status}")
    for line in v.fencing_sample[:10]:
        out.append(f"  fencing: {line}")
    for act in r.operator:
        out.append(f"  operator: {act}")
    for note in r.notes:
        out.append(f"  note: {note}")
    return "\n".join(out)


def result_json(r: ChaosResult) -> dict[str, Any]:
    v = asdict(r.verdict)
    v["duplicate_rate"] = r.verdict.duplicate_rate
    v["ok"] = r.verdict.ok
    v["failures"] = r.verdict.failures
    return {
        "verdict": v,
        "group": r.group,
        "topics": r.topics,
        "seconds": r.seconds,
        "chaos_seconds": r.chaos_seconds,
        "drain_seconds": r.drain_seconds,
        "drain_passes": r.drain_passes,
        "stalls": dict(r.stalls),
        "stalls_missed": r.stalls_missed,
        "child_failures": r.child_failures,
        "freezes": r.freezes,
        "freezes_past_session": r.freezes_past_session,
        "net_freezes": r.net_freezes,
        "net_freezes_past_session": r.net_freezes_past_session,
        "commit_failures": dict(r.commit_failures),
        "commit_modes": dict(r.commit_modes),
        "apis": dict(r.apis),
        "recoveries": r.recoveries,
        "degraded_recoveries": r.degraded_recoveries,
        "notes": r.notes,
        "operator": r.operator,
        # what the verdict held the group to, for analysing a campaign again
        "operator_effects": [{"kind": type(e).__name__, **asdict(e)} for e in r.operator_effects],
    }


def dumps(r: ChaosResult) -> str:
    return json.dumps(result_json(r), indent=2, default=str)
