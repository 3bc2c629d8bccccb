"""Options of the two Spark data sources, parsed and checked once on the driver.

Spark hands a data source its options as strings with lower-cased keys; every
problem is reported as a ConfigError naming the option, before any client is
created.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fastrecover.config import DEFAULT_STORE_FILE
from fastrecover.errors import ConfigError

__all__ = [
    "OPTION_DOCS",
    "RangesOptions",
    "SourceOptions",
    "parse_ranges_options",
    "parse_source_options",
]

QUERY_GROUP_PREFIX = "spark-query:"

#: option -> (default shown in the docs, meaning); the docs table is generated from this.
OPTION_DOCS: dict[str, tuple[str, str]] = {
    "kafka.bootstrap.servers": (
        "(required)",
        "Kafka bootstrap servers; every `kafka.*` option goes to librdkafka.",
    ),
    "subscribe": ("(required, stream)", "Comma-separated topics to read."),
    "fastrecover.query": (
        "(required, stream)",
        "Name of the query in the store (initial offset, range mirror).",
    ),
    "fastrecover.store.url": (f"sqlite:///./{DEFAULT_STORE_FILE}", "SQLAlchemy URL of the range store."),
    "startingOffsets": ("latest", "`latest` or `earliest`: where a NEW query starts (stored on first use)."),
    "fastrecover.backfill.min.offsets": (
        "100",
        "Lag that triggers recovery (jump to the log end) after a restart.",
    ),
    "maxBackfillOffsetsPerTrigger": (
        "100000",
        "Backfill offsets per micro-batch at most (live is unlimited).",
    ),
    "backfillTasks": ("4", "Spark tasks one batch's backfill (or a ranges job) is cut into."),
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


def _kafka(options: Mapping[str, str]) -> dict[str, str]:
    conf = {k[len("kafka.") :]: str(v) for k, v in options.items() if k.lower().startswith("kafka.")}
    if not conf.get("bootstrap.servers"):
        raise ConfigError("option kafka.bootstrap.servers is required")
    for forbidden in ("group.id", "enable.auto.commit"):
        if forbidden in conf:
            raise ConfigError(
                f"option kafka.{forbidden} is not supported: the source never joins a group nor commits "
                "to Kafka (Spark's checkpoint and the range store keep the offsets)"
            )
    return conf


def _store_url(options: Mapping[str, str]) -> str:
    url = _get(options, "fastrecover.store.url")
    if url is None or url == "":
        import os

        return "sqlite:///" + os.path.join(os.getcwd(), DEFAULT_STORE_FILE)
    if "://" not in url:
        raise ConfigError(f"option fastrecover.store.url: expected an SQLAlchemy URL, got {url!r}")
    return url


@dataclass(frozen=True)
class SourceOptions:
    """Options of the streaming source ``format("fastrecover")``."""

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


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    topics_raw = _get(opts, "subscribe")
    if not topics_raw:
        raise ConfigError("option subscribe is required: a comma-separated list of topics")
    topics = tuple(sorted({t.strip() for t in topics_raw.split(",") if t.strip()}))
    if not topics:
        raise ConfigError(f"option subscribe names no topic: {topics_raw!r}")
    if _get(opts, "subscribePattern") or _get(opts, "assign"):
        raise ConfigError("options subscribePattern and assign are not supported; use subscribe")
    query = _get(opts, "fastrecover.query")
    if not query:
        raise ConfigError(
            "option fastrecover.query is required: a stable name for this query, under which the store "
            "keeps its initial offset and its backfill ranges"
        )
    if len(query) > 200:
        raise ConfigError(f"option fastrecover.query: at most 200 characters, got {len(query)}")
    starting = (_get(opts, "startingOffsets") or "latest").lower()
    if starting not in ("latest", "earliest"):
        raise ConfigError(f"option startingOffsets: expected latest or earliest, got {starting!r}")
    max_backfill = _int(opts, "maxBackfillOffsetsPerTrigger", 100_000, 1)
    fresh_wait = _int(opts, "freshWaitMs", 1000, 0)
    timeout = _int(opts, "fastrecover.read.timeout.ms", 120_000, 1)
    return SourceOptions(
        kafka=_kafka(opts),
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
    )


@dataclass(frozen=True)
class RangesOptions:
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
        kafka=_kafka(opts),
        group=group,
        job=job,
        store_url=_store_url(opts),
        backfill_tasks=_int(opts, "backfillTasks", 4, 1) or 4,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        read_timeout_s=(timeout or 120_000) / 1000.0,
    )
