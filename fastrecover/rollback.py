"""``fastrecover rollback``: the documented way back from parallel mode to plain consumers.

A group that ran with ``enable.parallel.rebalance`` keeps two commit logs: Kafka's
offset (which the primary moved to the log end when it split a range off) and
the open range tokens in the store.  A plain ``confluent_kafka.Consumer`` only
reads the first, so after a fastrecover consumer died mid-backfill it would
start at the log end and never read what the open ranges still hold.

Rollback folds the store's log back into Kafka's: for every partition with open
ranges, Kafka's committed offset moves *back* to the lowest unfinished offset
(the lowest committed offset of the open ranges, or Kafka's own when that is
lower), then those open tokens are deleted.  Ranges that only the
commit-metadata mirror still names (the store lost them: wiped, restored from an
old backup, or the wrong URL; or it has them only under a lineage the committed
offset does not vouch for) count too, from their start: the mirror is
untrusted, so it may only move an offset back, which costs duplicates at worst.  Done tokens stay: they record
finished work.  A plain consumer then re-reads from there: duplicates (records
the primary or the child had already finished above that offset), never loss.
An offset never goes below the partition's log start: one there would send a plain
consumer to ``auto.offset.reset``, and under ``latest`` past everything retention
left.  A committed offset synced from another cluster above ranges unfinished there
(MirrorMaker 2: ``recovery.synced_from_elsewhere``) moves back to the log start.

It refuses to run while the group has members: a live fastrecover consumer
would keep writing both logs, and Kafka itself refuses to alter the offsets of
a non-empty group.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from fastrecover.book import mirror_context
from fastrecover.codec import cluster_label, read_marker
from fastrecover.errors import BrokerUnavailableError as BrokerUnavailableError  # re-exported: it was defined here
from fastrecover.errors import CodecError, ConfigError, FastRecoverError, StateError
from fastrecover.ranges import OffsetRange, subtract
from fastrecover.recovery import synced_from_elsewhere, this_cluster, trust_of
from fastrecover.tables import format_table, printable
from fastrecover.tokens import Token, TopicPartitionKey

if TYPE_CHECKING:
    from fastrecover.store.sql import RangeStore

log = logging.getLogger("fastrecover.rollback")

#: Seconds each admin request to the broker may take before the command gives up.
DEFAULT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PartitionRollback:
    """What rollback does (or did) for one partition.

    ``kafka_before`` is None when the group had no committed offset there;
    ``target`` is None when Kafka's offset is already at or below every open
    range's committed offset, and when there is none (only the tokens are deleted then).
    ``mirrored`` are the spans only the commit-metadata mirror names.
    """

    topic: str
    partition: int
    kafka_before: int | None
    lowest_unfinished: int
    target: int | None
    token_ids: tuple[int, ...]
    error: str | None = None
    mirrored: tuple[OffsetRange, ...] = ()


def plan_rollback(
    open_tokens: Sequence[Token],
    kafka: Mapping[tuple[str, int], int | None],
    mirror_only: Mapping[tuple[str, int], Sequence[OffsetRange]] | None = None,
    log_starts: Mapping[tuple[str, int], int] | None = None,
) -> list[PartitionRollback]:
    """Pure: per partition with unfinished ranges, where Kafka's offset must go (never forwards).

    ``mirror_only`` are spans the mirror names and the store does not know at all;
    they are unfinished from their start.  A partition with no committed offset gets none:
    no offset vouches for its ranges (a re-created topic, a deleted group, expired offsets), and
    one set from them would make a plain consumer skip the records below it that
    ``auto.offset.reset=earliest`` reads.  Its consumers start where that setting says, as a
    recovery's would.  No target lies below the partition's log start (``log_starts``), where
    the records below it went.
    """
    by_partition: dict[tuple[str, int], list[Token]] = {}
    for token in open_tokens:
        if token.is_open:
            by_partition.setdefault((token.topic, token.partition), []).append(token)
    lost = {k: tuple(v) for k, v in (mirror_only or {}).items() if v}
    plans: list[PartitionRollback] = []
    for topic, partition in sorted(set(by_partition) | set(lost)):
        tokens = by_partition.get((topic, partition), [])
        spans = lost.get((topic, partition), ())
        lowest = min([t.progress.committed for t in tokens] + [span.start for span in spans])
        before = kafka.get((topic, partition))
        floor = max(lowest, (log_starts or {}).get((topic, partition), lowest))
        target = floor if before is not None and floor < before else None
        ids = tuple(sorted(t.id for t in tokens))
        plans.append(PartitionRollback(topic, partition, before, lowest, target, ids, mirrored=spans))
    return plans


def mirror_only_spans(
    metadata: Mapping[tuple[str, int], str | None],
    known: Sequence[Token],
    group: str,
    key: bytes | None,
    offsets: Mapping[tuple[str, int], int | None],
    cluster: str,
    log_starts: Mapping[tuple[str, int], int] | None = None,
) -> dict[tuple[str, int], list[OffsetRange]]:
    """Pure: spans the committed metadata mirrors as unfinished that no store token it vouches for covers.

    Only a token the committed offset vouches for (``recovery.trust_of``: the marker's lineage,
    committed with that very offset) may excuse a mirrored span, as in a recovery: a done token
    of another lineage (a store restored from a backup older than a re-created topic, an offset
    reset) describes offsets that may no longer hold the same records.  Unreadable or foreign
    metadata names nothing (logged): the store stays the authority.  A marker of another cluster
    that lists unfinished ranges was copied here with the offset (``recovery.synced_from_elsewhere``):
    its ranges are in that cluster's offsets, so everything here from the log start to the offset is owed.
    """
    tokens_by_partition: dict[tuple[str, int], list[Token]] = {}
    for token in known:
        if not token.is_superseded:  # a retired token's facts no longer hold: it covers nothing
            tokens_by_partition.setdefault((token.topic, token.partition), []).append(token)
    out: dict[tuple[str, int], list[OffsetRange]] = {}
    for (topic, partition), text in sorted(metadata.items()):
        if not text:
            continue
        try:
            marker = read_marker(text, key=key, context=mirror_context(group, TopicPartitionKey(topic, partition)))
        except CodecError as exc:
            log.warning("ignoring the unreadable commit-metadata mirror of %s[%d]: %s", topic, partition, exc)
            continue
        if marker is None:
            continue
        committed = offsets.get((topic, partition))
        if committed is not None and synced_from_elsewhere(marker, cluster):
            start = (log_starts or {}).get((topic, partition), 0)
            out[(topic, partition)] = [OffsetRange(start, max(start, committed))]
            continue
        trust = trust_of(committed, marker, cluster)
        vouched = [t.span for t in tokens_by_partition.get((topic, partition), []) if trust.vouches(t)]
        lost = [
            piece for entry in marker.ranges if not entry.done for piece in subtract(entry.span, vouched) if len(piece)
        ]
        if lost:
            out[(topic, partition)] = sorted(lost, key=lambda r: r.start)
    return out


def admin_client(bootstrap: str, extra: Mapping[str, str] | None = None, *, verbose: bool = False) -> AdminClient:
    """An admin client; librdkafka's own connection chatter stays off stderr unless ``verbose``.

    The command reports a dead broker itself, in one line, after its timeout.
    """
    config: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, "log_level": 7 if verbose else 0}
    config.update(extra or {})
    try:
        return AdminClient(config)
    except (KafkaException, ValueError, TypeError) as exc:
        # librdkafka names the property it refused; the values may be secrets and are not repeated
        cause = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
        raise ConfigError(f"the admin client refused its configuration (--command-config): {cause}") from exc


def check_broker(admin: AdminClient, bootstrap: str, timeout_s: float) -> None:
    """Fail fast, with a one-line error, when no broker answers within ``timeout_s``."""
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"no Kafka broker answered at {bootstrap} within {timeout_s:g} s ({exc.args[0]})"
        ) from exc


def _result(future: concurrent.futures.Future[object], bootstrap: str, timeout_s: float, what: str) -> object:
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError as exc:
        raise BrokerUnavailableError(f"{what}: no answer from {bootstrap} within {timeout_s:g} s") from exc
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
            raise BrokerUnavailableError(f"{what}: {error.str()}") from exc
        raise FastRecoverError(f"{what} failed: {error}") from exc


def _result_unless(
    future: concurrent.futures.Future[object], bootstrap: str, timeout_s: float, what: str, code: int
) -> object | None:
    """:func:`_result`, or None when the broker answered with the error ``code`` (an expected absence)."""
    try:
        return _result(future, bootstrap, timeout_s, what)
    except FastRecoverError as exc:
        cause = exc.__cause__
        if isinstance(cause, KafkaException) and cause.args[0].code() == code:
            return None
        raise


def cluster_id(admin: AdminClient, bootstrap: str, timeout_s: float) -> str | None:
    """The id of the cluster ``admin`` talks to (None from brokers too old to have one)."""
    future = admin.describe_cluster(request_timeout=timeout_s)
    found = getattr(_result(future, bootstrap, timeout_s, "describing the Kafka cluster"), "cluster_id", None)
    return None if found is None else str(found)


def ensure_group_empty(admin: AdminClient, group: str, bootstrap: str, timeout_s: float) -> None:
    """StateError unless the group has no members (an unknown group counts as empty)."""
    future = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
    what = f"describing group {group!r}"
    description = _result_unless(future, bootstrap, timeout_s, what, KafkaError.GROUP_ID_NOT_FOUND)
    members = list(getattr(description, "members", []) or [])
    if members:
        state = getattr(description, "state", None)
        names = ", ".join(sorted(str(getattr(m, "client_id", "?")) for m in members)[:5])
        raise StateError(
            f"group {group!r} has {len(members)} active member(s) ({names}; state "
            f"{getattr(state, 'name', state)}): stop every consumer of the group, wait for its session to "
            "expire, then run rollback again"
        )


def kafka_offsets(
    admin: AdminClient, group: str, bootstrap: str, timeout_s: float
) -> tuple[dict[tuple[str, int], int | None], dict[tuple[str, int], str | None]]:
    """Every committed offset of the group, and the metadata committed with it."""
    request = ConsumerGroupTopicPartitions(group)
    future = admin.list_consumer_group_offsets([request], request_timeout=timeout_s)[group]
    result = _result(future, bootstrap, timeout_s, f"reading the committed offsets of group {group!r}")
    offsets: dict[tuple[str, int], int | None] = {}
    metadata: dict[tuple[str, int], str | None] = {}
    for tp in getattr(result, "topic_partitions", []) or []:
        if tp.error is not None:
            raise FastRecoverError(f"reading the committed offset of {tp.topic}[{tp.partition}]: {tp.error}")
        offsets[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        metadata[(tp.topic, tp.partition)] = tp.metadata
    return offsets, metadata


def log_starts(
    admin: AdminClient, partitions: Iterable[tuple[str, int]], bootstrap: str, timeout_s: float
) -> dict[tuple[str, int], int]:
    """Each partition's log start: where retention left it (a partition that no longer exists is left out)."""
    earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    specs = {TopicPartition(topic, partition): earliest for topic, partition in sorted(set(partitions))}
    if not specs:
        return {}
    starts: dict[tuple[str, int], int] = {}
    for tp, future in admin.list_offsets(specs, request_timeout=timeout_s).items():
        what = f"reading the log start of {tp.topic}[{tp.partition}]"
        info = _result_unless(future, bootstrap, timeout_s, what, KafkaError.UNKNOWN_TOPIC_OR_PART)
        if info is not None:
            starts[(tp.topic, tp.partition)] = int(getattr(info, "offset", 0))
    return starts


def move_offsets(
    admin: AdminClient, group: str, plans: Sequence[PartitionRollback], bootstrap: str, timeout_s: float
) -> dict[tuple[str, int], str]:
    """Alter the group's offsets to each plan's target; returns errors by partition (empty: all moved)."""
    moves = [p for p in plans if p.target is not None]
    if not moves:
        return {}
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(p.topic, p.partition, p.target) for p in moves if p.target is not None]
    )
    future = admin.alter_consumer_group_offsets([request], request_timeout=timeout_s)[group]
    result = _result(future, bootstrap, timeout_s, f"moving the offsets of group {group!r}")
    errors: dict[tuple[str, int], str] = {}
    answered: set[tuple[str, int]] = set()
    for tp in getattr(result, "topic_partitions", []) or []:
        answered.add((tp.topic, tp.partition))
        if tp.error is not None:
            errors[(tp.topic, tp.partition)] = str(tp.error)
    for p in moves:
        if (p.topic, p.partition) not in answered:
            errors[(p.topic, p.partition)] = "the broker did not confirm the new offset"
    return errors


def roll_back(
    admin: AdminClient,
    store: RangeStore,
    group: str,
    *,
    bootstrap: str,
    timeout_s: float,
    dry_run: bool,
    mirror_key: bytes | None = None,
) -> tuple[list[PartitionRollback], dict[tuple[str, int], str], int]:
    """Plan (and unless ``dry_run`` carry out) the rollback of ``group``: (plans, errors by partition, deleted).

    Open ranges are deleted only for the partitions whose new Kafka offset the
    broker confirmed; a partition that failed keeps its ranges.
    """
    # only this cluster's ranges: a store shared by two clusters holds the other's under the same names, and
    # deleting them would lose the records they owe there
    cluster = cluster_label(cluster_id(admin, bootstrap, timeout_s))
    known = this_cluster(store.ranges(group), cluster)  # a corrupt open token must stop the rollback, not vanish
    offsets, metadata = kafka_offsets(admin, group, bootstrap, timeout_s)
    starts = log_starts(admin, [*offsets, *((t.topic, t.partition) for t in known if t.is_open)], bootstrap, timeout_s)
    spans = mirror_only_spans(metadata, known, group, mirror_key, offsets, cluster, starts)
    plans = plan_rollback(known, offsets, spans, starts)
    if not plans or dry_run:
        return plans, {}, 0
    # the group must still be empty right before the move; Kafka refuses it otherwise anyway
    ensure_group_empty(admin, group, bootstrap, timeout_s)
    errors = move_offsets(admin, group, plans, bootstrap, timeout_s)
    safe = [i for p in plans if (p.topic, p.partition) not in errors for i in p.token_ids]
    return plans, errors, store.delete_open(group, safe)


def read_properties(lines: Iterable[str], name: str) -> dict[str, str]:
    """``key=value`` lines (``--command-config``); blank lines and ``#``/``!`` comments are skipped."""
    props: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name}:{number}: expected key=value")
        props[key.strip()] = value.strip()
    return props


ROLLBACK_HEADER = ("TOPIC", "PART", "KAFKA OFFSET", "LOWEST UNFINISHED", "NEW OFFSET", "OPEN RANGES", "RESULT")


def _kept(p: PartitionRollback) -> str:
    return "already lower" if p.kafka_before is not None else "no offset: auto.offset.reset decides"


def format_rollback(plans: Sequence[PartitionRollback], errors: Mapping[tuple[str, int], str], *, dry_run: bool) -> str:
    """Pure: the table ``fastrecover rollback`` prints, one line per partition, with what happened to it."""
    rows = []
    for p in plans:
        error = errors.get((p.topic, p.partition))
        if error:
            result = f"FAILED: {printable(error)}"
        elif dry_run:
            result = "would move back" if p.target is not None else f"would keep ({_kept(p)})"
        else:
            result = "moved back" if p.target is not None else f"kept ({_kept(p)})"
        after = p.target if p.target is not None else p.kafka_before
        rows.append(
            (
                printable(p.topic),
                str(p.partition),
                "-" if p.kafka_before is None else str(p.kafka_before),
                str(p.lowest_unfinished),
                "-" if after is None else str(after),
                ", ".join([f"#{i}" for i in p.token_ids] + [f"mirror [{r.start}, {r.end})" for r in p.mirrored]),
                result,
            )
        )
    return format_table(ROLLBACK_HEADER, rows)
