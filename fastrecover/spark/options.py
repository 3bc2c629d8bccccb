"""Options of the two Spark data sources, parsed and checked once on the driver.

Spark hands a data source its options as strings with lower-cased keys; every
problem is reported as a ConfigError naming the option, before any client is
created.  The ``kafka.*`` options (which keys are refused, which values are
secrets) are checked by :mod:`fastrecover.spark.client_conf`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from fastrecover.config import DEFAULT_STORE_FILE
from fastrecover.errors import ConfigError
from fastrecover.spark.client_conf import MaskedRepr, kafka_conf, mask_secrets_in_url

__all__ = [
    "OPTION_DOCS",
    "OWN_OPTIONS",
    "RangesOptions",
    "SourceOptions",
    "job_owner",
    "options_to_check",
    "parse_ranges_options",
    "parse_source_options",
]

QUERY_GROUP_PREFIX = "spark-query:"

#: option -> (default shown in the docs, meaning); the docs table is generated from this.
OPTION_DOCS: dict[str, tuple[str, str]] = {
    "kafka.bootstrap.servers": (
        "(required)",
        "Kafka bootstrap servers; `kafka.*` options go to the Kafka client (librdkafka property names).",
    ),
    "subscribe": ("(one of three, stream)", "Comma-separated topics to read."),
    "subscribePattern": (
        "(one of three, stream)",
        "Regular expression (Python `re.fullmatch`) of the topics to read; new matching topics are picked up.",
    ),
    "assign": ("(one of three, stream)", 'JSON of the partitions to read, e.g. `{"orders":[0,1]}`.'),
    "fastrecover.query": (
        "(required, stream)",
        "Name of the query in the store (initial offset, range mirror).",
    ),
    "fastrecover.store.url": (f"sqlite:///./{DEFAULT_STORE_FILE}", "SQLAlchemy URL of the range store."),
    "startingOffsets": (
        "latest",
        '`latest`, `earliest` or JSON per partition (`{"orders":{"0":23,"1":-2}}`, -2 earliest, -1 latest): '
        "where a NEW query starts (stored on first use).",
    ),
    "maxOffsetsPerTrigger": (
        "(none)",
        "Live offsets per micro-batch at most, shared between partitions in proportion to their lag.",
    ),
    "minPartitions": ("(none)", "At least this many Spark tasks for a batch's live records."),
    "includeHeaders": ("false", "Add the `headers` column (array of key/value structs), as Spark's source."),
    "fastrecover.backfill.min.offsets": (
        "100",
        "Lag that triggers recovery (jump to the log end) after a restart.",
    ),
    "maxBackfillOffsetsPerTrigger": (
        "100000",
        "Backfill offsets per micro-batch at most (live is unlimited). `start_kafka_stream`: 5000000.",
    ),
    "backfillTasks": (
        "4",
        "Spark tasks one batch's backfill (or a ranges job) is cut into. `start_kafka_stream`: Spark's cores"
        " (`defaultParallelism`).",
    ),
    "maxOffsetsPerTask": (
        "(none)",
        "Cut a partition's live records into tasks of at most this many offsets.",
    ),
    "freshWaitMs": (
        "1000",
        "After a restart, wait up to this long for a fresh record to cut the first batch.",
    ),
    "failOnDataLoss": ("true", "Fail when records to read were deleted (retention); false skips them."),
    "fastrecover.read.timeout.ms": (
        "120000",
        "A task fails when a range read makes no progress for this long.",
    ),
    "group": (
        "(required, ranges)",
        "Consumer group whose open range tokens a `fastrecover-ranges` job drains.",
    ),
    "fastrecover.job": ("default", "Name of the ranges job; its claim is completed with `complete_ranges`."),
}


def _get(options: Mapping[str, str], key: str) -> str | None:
    value = options.get(key.lower())
    if value is None:
        return None
    return str(value).strip()


def _int(options: Mapping[str, str], key: str, default: int | None, minimum: int) -> int | None:
    raw = _get(options, key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"option {key}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {key}: {value} is out of range, must be >= {minimum}")
    return value


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = _get(options, key)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ConfigError(f"option {key}: expected true or false, got {raw!r}")


def _store_url(options: Mapping[str, str]) -> str:
    url = _get(options, "fastrecover.store.url")
    if url is None or url == "":
        import os

        return "sqlite:///" + os.path.join(os.getcwd(), DEFAULT_STORE_FILE)
    if "://" not in url:
        raise ConfigError(f"option fastrecover.store.url: expected an SQLAlchemy URL, got {mask_secrets_in_url(url)!r}")
    return url


@dataclass(frozen=True, repr=False)
class SourceOptions(MaskedRepr):
    """Options of the streaming source ``format("fastrecover")``.

    Exactly one of ``topics`` (subscribe), ``pattern`` (subscribePattern) and
    ``assign`` names what to read.
    """

    kafka: dict[str, str]
    topics: tuple[str, ...]
    query: str
    store_url: str
    starting: str = "latest"
    min_lag: int = 100
    max_backfill: int | None = 100_000
    backfill_tasks: int = 4
    max_live_per_task: int | None = None
    fresh_wait_s: float = 1.0
    fail_on_data_loss: bool = True
    read_timeout_s: float = 120.0
    pattern: str | None = None
    assign: tuple[tuple[str, int], ...] | None = None
    starting_specific: tuple[tuple[str, int, int], ...] | None = None
    max_live: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one this query reads."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assign is not None:
            return any(t == topic for t, _ in self.assign)
        return topic in self.topics


def _parse_assign(raw: str) -> tuple[tuple[str, int], ...]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f'option assign: expected JSON like {{"topic":[0,1]}}, got {raw!r}: {exc}') from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(f'option assign: expected a non-empty JSON object like {{"topic":[0,1]}}, got {raw!r}')
    out: set[tuple[str, int]] = set()
    for topic, parts in data.items():
        if not isinstance(parts, list) or not all(isinstance(p, int) and p >= 0 for p in parts):
            raise ConfigError(f"option assign: topic {topic!r} needs a list of partition numbers, got {parts!r}")
        out.update((str(topic), int(p)) for p in parts)
    return tuple(sorted(out))


def _parse_starting(raw: str) -> tuple[str, tuple[tuple[str, int, int], ...] | None]:
    if raw.lower() in ("latest", "earliest"):
        return raw.lower(), None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigError(
            f"option startingOffsets: expected latest, earliest or JSON per partition, got {raw!r}"
        ) from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f'option startingOffsets: expected JSON like {{"topic":{{"0":23}}}}, got {raw!r}')
    out: list[tuple[str, int, int]] = []
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise ConfigError(f"option startingOffsets: topic {topic!r} needs an object of partition -> offset")
        for part, offset in parts.items():
            try:
                p = int(part)
            except ValueError:
                raise ConfigError(f"option startingOffsets: {topic!r} partition {part!r} is not a number") from None
            if not isinstance(offset, int) or offset < -2 or p < 0:
                raise ConfigError(
                    f"option startingOffsets: {topic}[{part}] = {offset!r}; an offset is >= 0, "
                    "-2 (earliest) or -1 (latest)"
                )
            out.append((str(topic), p, offset))
    return "json", tuple(sorted(out))


def parse_source_options(options: Mapping[str, str], *, query_required: bool = True) -> SourceOptions:
    """The options of ``format("fastrecover")``; ``start_kafka_stream`` (no store) needs no query name."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    topics_raw, pattern, assign_raw = _get(opts, "subscribe"), _get(opts, "subscribePattern"), _get(opts, "assign")
    given = [
        name for name, v in (("subscribe", topics_raw), ("subscribePattern", pattern), ("assign", assign_raw)) if v
    ]
    if len(given) != 1:
        raise ConfigError(
            "exactly one of the options subscribe, subscribePattern and assign is required"
            + (f", got {', '.join(given)}" if given else "")
        )
    topics: tuple[str, ...] = ()
    assign = None
    if topics_raw:
        topics = tuple(sorted({t.strip() for t in topics_raw.split(",") if t.strip()}))
        if not topics:
            raise ConfigError(f"option subscribe names no topic: {topics_raw!r}")
    elif pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"option subscribePattern: {pattern!r} is not a regular expression: {exc}") from exc
    else:
        assign = _parse_assign(assign_raw or "")
        topics = tuple(sorted({t for t, _ in assign}))
    query = _get(opts, "fastrecover.query") or ("" if query_required else "-")
    if not query:
        raise ConfigError(
            "option fastrecover.query is required: a stable name for this query, under which the store "
            "keeps its initial offset and its backfill ranges"
        )
    if len(query) > 200:
        raise ConfigError(f"option fastrecover.query: at most 200 characters, got {len(query)}")
    starting, specific = _parse_starting(_get(opts, "startingOffsets") or "latest")
    if specific is not None and not pattern:
        wanted = set(assign) if assign is not None else None
        for topic, part, _ in specific:
            if topic not in topics or (wanted is not None and (topic, part) not in wanted):
                raise ConfigError(f"option startingOffsets names {topic}[{part}], which this query does not read")
    for key in ("endingOffsets", "endingTimestamp", "startingTimestamp", "startingOffsetsByTimestamp"):
        if _get(opts, key):
            raise ConfigError(f"option {key} is not supported by the streaming source (see docs/spark.md)")
    max_backfill = _int(opts, "maxBackfillOffsetsPerTrigger", 100_000, 1)
    fresh_wait = _int(opts, "freshWaitMs", 1000, 0)
    timeout = _int(opts, "fastrecover.read.timeout.ms", 120_000, 1)
    return SourceOptions(
        kafka=kafka_conf(opts),
        topics=topics,
        query=query,
        store_url=_store_url(opts),
        starting=starting,
        min_lag=_int(opts, "fastrecover.backfill.min.offsets", 100, 1) or 100,
        max_backfill=max_backfill,
        backfill_tasks=_int(opts, "backfillTasks", 4, 1) or 4,
        max_live_per_task=_int(opts, "maxOffsetsPerTask", None, 1),
        fresh_wait_s=(fresh_wait or 0) / 1000.0,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        read_timeout_s=(timeout or 120_000) / 1000.0,
        pattern=pattern or None,
        assign=assign,
        starting_specific=specific,
        max_live=_int(opts, "maxOffsetsPerTrigger", None, 1),
        min_partitions=_int(opts, "minPartitions", None, 1),
        include_headers=_bool(opts, "includeHeaders", False),
    )


@dataclass(frozen=True, repr=False)
class RangesOptions(MaskedRepr):
    """Options of the batch source ``format("fastrecover-ranges")``."""

    kafka: dict[str, str]
    group: str
    job: str
    store_url: str
    backfill_tasks: int = 4
    fail_on_data_loss: bool = True
    read_timeout_s: float = 120.0

    @property
    def owner(self) -> str:
        return job_owner(self.job)


def job_owner(job: str) -> str:
    """The owner name a ranges job writes on the tokens it claims."""
    return f"spark-ranges:{job}"


def parse_ranges_options(options: Mapping[str, str]) -> RangesOptions:
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    group = _get(opts, "group")
    if not group:
        raise ConfigError("option group is required: the consumer group whose open ranges to drain")
    if group.startswith(QUERY_GROUP_PREFIX):
        raise ConfigError(
            f"option group: {group!r} is a streaming query's mirror of its own backfill, which its Spark "
            "checkpoint drives; it cannot be drained by a ranges job"
        )
    job = _get(opts, "fastrecover.job") or "default"
    timeout = _int(opts, "fastrecover.read.timeout.ms", 120_000, 1)
    return RangesOptions(
        kafka=kafka_conf(opts),
        group=group,
        job=job,
        store_url=_store_url(opts),
        backfill_tasks=_int(opts, "backfillTasks", 4, 1) or 4,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        read_timeout_s=(timeout or 120_000) / 1000.0,
    )


# -- start_kafka_stream: which options are ours, which Spark's ----------------------------------

#: start_kafka_stream's own options (lower-cased prefixes); every other option is Spark's Kafka source's and
#: goes to it unchanged.  ``freshWaitMs`` and ``maxOffsetsPerTask`` are format("fastrecover")'s, with no effect
#: here: kept from Spark's source, as before
OWN_OPTIONS = ("fastrecover.", "maxbackfilloffsetspertrigger", "backfilltasks", "freshwaitms", "maxoffsetspertask")
#: Spark options whose values the recovery uses too, with Spark's meaning and Spark's accepted values: the
#: backlog's reads take failOnDataLoss and includeHeaders (which also shapes the idle ticker's rows), a
#: batch run again before Spark starts reads its live records in minPartitions tasks
_SHARED_OPTIONS = ("failondataloss", "includeheaders", "minpartitions")


def options_to_check(options: Mapping[str, str]) -> dict[str, str]:
    """The options of start_kafka_stream that ``parse_source_options`` checks, lower-cased.

    Ours, the Spark options the recovery uses as well, the ``kafka.*`` keys (the refused ones are refused
    here too; ``kafka.group.id`` is Spark's to use) and what to read, so that a query with a bad option
    fails before the recovery writes anything.  Every other Spark option (``startingOffsets``,
    ``startingTimestamp``, ``maxTriggerDelay``, ...) is left to Spark's source, which checks it with its
    own rules when the query starts.  ``subscribePattern`` is a Java regular expression, which Python's
    ``re`` may not compile (``\\p{Alpha}``): only whether it is given is checked here.
    """
    out: dict[str, str] = {}
    for key, value in options.items():
        low, text = str(key).lower(), str(value)
        if low == "subscribepattern":
            out[low] = "." if text.strip() else ""
        elif (
            low.startswith(OWN_OPTIONS)
            or low in _SHARED_OPTIONS
            or low in ("subscribe", "assign")
            or (low.startswith("kafka.") and low != "kafka.group.id")
        ):
            out[low] = text
    return out
