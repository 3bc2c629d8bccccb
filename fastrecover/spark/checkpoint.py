"""The files of a Spark checkpoint this package reads and writes, as pure parse/render functions.

:func:`fastrecover.spark.start_kafka_stream` recovers by editing the
checkpoint of a query that reads with Spark's own Kafka source, before Spark
starts it.  Two formats are Spark's (an internal format, ``v1``, unchanged
through Spark 3 and 4, but not an API):

- ``offsets/<batch>``: ``v1``, one JSON line of batch metadata, then one line
  per source: its end offset as JSON, or ``-`` for a source without one.  The
  Kafka source's offset is ``{"topic": {"partition": offset}}``.
- ``commits/<batch>``: ``v1`` and one JSON line; the batch is done when it exists.

One is ours, under ``fastrecover/`` in the checkpoint: a *journal* entry is a
list of offset ranges (the lag ranges of a jump, or the backfill chunk a batch
reads).  Everything here is read from disk, so it is untrusted: a malformed
entry raises :class:`CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from fastrecover.errors import CheckpointError
from fastrecover.spark.offsets import Piece, partition_number
from fastrecover.tokens import TopicPartitionKey

__all__ = [
    "OffsetLogEntry",
    "is_kafka_offset",
    "kafka_offsets",
    "parse_journal",
    "parse_offset_log",
    "render_journal",
    "render_kafka_offsets",
]

_VERSION = "v1"
_JOURNAL_VERSION = 1
#: what Spark writes for a source that has no offset yet
NO_OFFSET = "-"


@dataclass(frozen=True)
class OffsetLogEntry:
    """One ``offsets/<batch>`` file: the batch metadata and each source's offset, as Spark wrote them."""

    metadata: dict[str, Any]
    sources: tuple[str, ...]

    def render(self) -> str:
        return "\n".join([_VERSION, json.dumps(self.metadata, separators=(",", ":")), *self.sources])

    def with_source(self, index: int, text: str, timestamp_ms: int) -> OffsetLogEntry:
        """The entry of a new batch: this one's metadata at ``timestamp_ms``, source ``index`` replaced."""
        sources = list(self.sources)
        sources[index] = text
        return OffsetLogEntry({**self.metadata, "batchTimestampMs": timestamp_ms}, tuple(sources))


def parse_offset_log(text: str, where: str) -> OffsetLogEntry:
    lines = text.splitlines()
    if not lines or lines[0].strip() != _VERSION:
        raise CheckpointError(f"{where}: not a v1 offset log entry (first line {lines[:1]!r})")
    if len(lines) < 3:
        raise CheckpointError(f"{where}: an offset log entry needs a metadata line and a source line, got {lines!r}")
    try:
        metadata = json.loads(lines[1])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{where}: the batch metadata is not JSON: {exc}") from exc
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{where}: the batch metadata is not a JSON object: {lines[1][:200]!r}")
    return OffsetLogEntry(metadata, tuple(line.strip() for line in lines[2:]))


def is_kafka_offset(text: str) -> bool:
    """Whether a source line has the shape of the Kafka source's offset (topic -> partition -> offset)."""
    if text == NO_OFFSET:
        return False
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and all(isinstance(v, dict) for v in data.values())


def kafka_offsets(text: str, where: str) -> dict[TopicPartitionKey, int]:
    """The Kafka source's offset line as partition -> next offset to read."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{where}: the Kafka source's offset is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: the Kafka source's offset is not a JSON object: {text[:200]!r}")
    out: dict[TopicPartitionKey, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise CheckpointError(f"{where}: topic {topic!r} has no partition -> offset object")
        for part, offset in parts.items():
            number = partition_number(part)
            if number is None or type(offset) is not int or offset < 0:
                raise CheckpointError(f"{where}: {topic}[{part!r}] = {offset!r} is not a partition and an offset")
            out[TopicPartitionKey(str(topic), number)] = offset
    return out


def render_kafka_offsets(offsets: Mapping[TopicPartitionKey, int]) -> str:
    doc: dict[str, dict[str, int]] = {}
    for key in sorted(offsets, key=lambda k: (k.topic, k.partition)):
        doc.setdefault(key.topic, {})[str(key.partition)] = offsets[key]
    return json.dumps(doc, separators=(",", ":"))


def render_journal(pieces: Iterable[Piece]) -> str:
    ranges = [[p.topic, p.partition, p.start, p.end] for p in pieces]
    return json.dumps({"version": _JOURNAL_VERSION, "ranges": ranges}, separators=(",", ":"))


def parse_journal(text: str, where: str) -> list[Piece]:
    """A journal entry: backfill pieces, each a non-empty range of one partition, disjoint."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{where}: not JSON: {exc}") from exc
    version = doc.get("version") if isinstance(doc, dict) else None
    if type(version) is not int or version != _JOURNAL_VERSION or not isinstance(doc.get("ranges"), list):
        raise CheckpointError(f"{where}: expected {{'version': {_JOURNAL_VERSION}, 'ranges': [...]}}")
    pieces: list[Piece] = []
    for item in doc["ranges"]:
        if (
            not isinstance(item, list)
            or len(item) != 4
            or not isinstance(item[0], str)
            or not item[0]
            or not all(type(v) is int for v in item[1:])
            or item[1] < 0
            or not 0 <= item[2] < item[3]
        ):
            raise CheckpointError(f"{where}: {item!r} is not [topic, partition, start, end) with start < end")
        pieces.append(Piece(item[0], item[1], item[2], item[3], True))
    ordered = sorted(pieces, key=lambda p: (p.topic, p.partition, p.start))
    for a, b in pairwise(ordered):
        if a.key == b.key and b.start < a.end:
            raise CheckpointError(f"{where}: ranges {a.start}-{a.end} and {b.start}-{b.end} of {a.key} overlap")
    return ordered
