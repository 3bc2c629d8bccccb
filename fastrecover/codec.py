"""Compact ASCII encodings: completion maps and the commit-metadata mirror.

Two things must be written as short text: the set of offsets that finished out
of order above a range's committed offset (stored in the token row), and the
open ranges of a partition (mirrored into the primary's Kafka commit metadata,
which brokers cap at ``offset.metadata.max.bytes``, 4096 by default).  Like the
Confluent Parallel Consumer we encode the completion map both as a bitset and
as run lengths, keep the smaller, compress with zstd when that pays, and base64
the result.  Decoding is strict: a malformed text raises ``CodecError`` rather
than yielding a wrong set, because a wrong set could skip records.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence

import zstandard

from fastrecover.errors import CodecError
from fastrecover.ranges import RangeProgress

_VERSION = "1"
_MIRROR_PREFIX = "fr1:"
#: librdkafka/broker default offset.metadata.max.bytes is 4096; keep a margin.
MIRROR_LIMIT = 4000
_ZSTD_LEVEL = 3
_MAX_DECOMPRESSED = 64 * 1024 * 1024


def _varint(n: int, out: bytearray) -> None:
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _read_varints(data: bytes) -> list[int]:
    values: list[int] = []
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise CodecError("varint too long in run-length completion map")
        else:
            values.append(value)
            value = shift = 0
    if shift:
        raise CodecError("truncated varint in run-length completion map")
    return values


def _decompress(raw: bytes) -> bytes:
    """zstd-decompress at most ``_MAX_DECOMPRESSED`` bytes.

    ``max_output_size`` only applies to frames that do not declare their size, so a
    frame declaring a huge content size is refused here before anything is allocated.
    """
    size = zstandard.frame_content_size(raw)
    if size > _MAX_DECOMPRESSED:
        raise CodecError(f"zstd payload declares {size} bytes, more than the {_MAX_DECOMPRESSED} allowed")
    data: bytes = zstandard.ZstdDecompressor().decompress(raw, max_output_size=_MAX_DECOMPRESSED)
    return data


def _bitset(deltas: Sequence[int]) -> bytes:
    bits = bytearray((deltas[-1] // 8) + 1)
    for d in deltas:
        bits[d >> 3] |= 1 << (d & 7)
    return bytes(bits)


def _runs(deltas: Sequence[int]) -> bytes:
    """Alternating run lengths: not-done, done, not-done, done, ..."""
    out = bytearray()
    cursor = 0
    i = 0
    while i < len(deltas):
        j = i
        while j + 1 < len(deltas) and deltas[j + 1] == deltas[j] + 1:
            j += 1
        _varint(deltas[i] - cursor, out)
        _varint(j - i + 1, out)
        cursor = deltas[j] + 1
        i = j + 1
    return bytes(out)


def encode_completed(committed: int, completed: Iterable[int]) -> str:
    """Encode offsets (all > committed) relative to ``committed + 1``; '' when empty."""
    deltas = sorted({o - committed - 1 for o in completed})
    if not deltas:
        return ""
    if deltas[0] < 0:
        raise ValueError(f"completed offset {deltas[0] + committed + 1} is not above committed {committed}")
    tag, raw = "r", _runs(deltas)
    # The bitset's size is known up front: only build it when it is the smaller one,
    # so a lone offset far above committed does not allocate a gigantic bitset.
    if deltas[-1] // 8 + 1 <= len(raw):
        tag, raw = "b", _bitset(deltas)
    packed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(raw)
    if len(packed) < len(raw):
        tag, raw = tag.upper(), packed
    return _VERSION + tag + base64.b64encode(raw).decode("ascii")


def decode_completed(committed: int, text: str, end: int | None = None) -> frozenset[int]:
    """Inverse of :func:`encode_completed`; raises ``CodecError`` on anything malformed.

    With ``end`` (the range's end), an offset at or beyond it is malformed too; the
    check runs before a run is expanded, so a corrupt run length cannot make the
    decoder build an enormous set.
    """
    if not text:
        return frozenset()
    if len(text) < 2 or text[0] != _VERSION or text[1] not in "bBrR":
        raise CodecError(f"unknown completion-map encoding {text[:8]!r}")
    tag = text[1]
    try:
        raw = base64.b64decode(text[2:], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CodecError(f"completion map is not valid base64: {text[:16]!r}...") from exc
    if tag.isupper():
        try:
            raw = _decompress(raw)
        except zstandard.ZstdError as exc:
            raise CodecError("completion map zstd payload is corrupt") from exc
    base = committed + 1
    if tag.lower() == "b":
        if end is not None and base + ((len(raw) - 1) << 3) >= end:
            raise CodecError(f"completion-map bitset of {len(raw)} bytes reaches beyond the range end {end}")
        offsets = {base + (i << 3) + bit for i, byte in enumerate(raw) for bit in range(8) if byte >> bit & 1}
        if end is not None and offsets and max(offsets) >= end:
            raise CodecError(f"completion map holds offset {max(offsets)} beyond the range end {end}")
    else:
        values = _read_varints(raw)
        if len(values) % 2:
            raise CodecError("run-length completion map has an odd number of runs")
        offsets = set()
        cursor = base
        for gap, length in zip(values[::2], values[1::2], strict=True):
            if length == 0:
                raise CodecError("run-length completion map has an empty run")
            cursor += gap
            if end is not None and cursor + length > end:
                raise CodecError(f"completion map run reaches offset {cursor + length - 1} beyond the range end {end}")
            offsets.update(range(cursor, cursor + length))
            cursor += length
    if not offsets:
        raise CodecError("completion map decodes to an empty set")
    return frozenset(offsets)


def encode_mirror(ranges: Sequence[RangeProgress], limit: int = MIRROR_LIMIT) -> str:
    """Mirror a partition's open ranges into commit metadata, fitting in ``limit``.

    When the full form does not fit, degrade in ways that can only cause
    re-delivery, never loss: first drop the completion maps (their offsets are
    backfilled again), then merge neighbouring ranges into covering ranges (the
    gap between them, already read by the primary, is re-read too).
    """
    entries = sorted((r for r in ranges if not r.done), key=lambda r: r.start)
    if not entries:
        return ""
    text = _mirror_text(entries, with_maps=True)
    if len(text) <= limit:
        return text
    text = _mirror_text(entries, with_maps=False)
    while len(text) > limit and len(entries) > 1:
        gaps = [entries[i + 1].start - entries[i].end for i in range(len(entries) - 1)]
        i = gaps.index(min(gaps))
        a, b = entries[i], entries[i + 1]
        # Cover both (even if they overlap or nest): everything from the lower committed
        # offset to the higher end is re-delivered, so nothing unfinished is dropped.
        merged_end = max(a.end, b.end)
        entries[i : i + 2] = [RangeProgress(a.start, merged_end, min(a.committed, b.committed))]
        text = _mirror_text(entries, with_maps=False)
    if len(text) > limit:
        raise ValueError(f"mirror of one range does not fit in {limit} characters")
    return text


def _mirror_text(entries: Sequence[RangeProgress], with_maps: bool) -> str:
    rows = [
        [r.start, r.end, r.committed, encode_completed(r.committed, r.completed) if with_maps else ""] for r in entries
    ]
    raw = json.dumps(rows, separators=(",", ":")).encode("ascii")
    packed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(raw)
    if len(packed) < len(raw):
        return _MIRROR_PREFIX + "Z" + base64.b64encode(packed).decode("ascii")
    return _MIRROR_PREFIX + "J" + base64.b64encode(raw).decode("ascii")


def is_mirror(text: str | None) -> bool:
    return bool(text) and str(text).startswith(_MIRROR_PREFIX)


def decode_mirror(text: str) -> list[RangeProgress]:
    """Ranges mirrored by :func:`encode_mirror`; '' or foreign metadata gives []."""
    if not is_mirror(text):
        return []
    body = text[len(_MIRROR_PREFIX) :]
    try:
        raw = base64.b64decode(body[1:], validate=True)
        if body[:1] == "Z":
            raw = _decompress(raw)
        elif body[:1] != "J":
            raise CodecError(f"unknown mirror encoding {body[:1]!r}")
        rows = json.loads(raw)
        if not isinstance(rows, list):
            raise CodecError(f"commit-metadata mirror is not a list of ranges: {text[:24]!r}...")
        ranges = []
        for row in rows:
            if not isinstance(row, list) or len(row) != 4:
                raise CodecError(f"commit-metadata mirror row {row!r} is not [start, end, committed, map]")
            s, e, c, m = row
            if not all(type(v) is int for v in (s, e, c)) or not isinstance(m, str):
                raise CodecError(f"commit-metadata mirror row {row!r} has a field of the wrong type")
            ranges.append(RangeProgress(s, e, c, decode_completed(c, m, end=e)))
        return ranges
    except CodecError:
        raise
    except (binascii.Error, ValueError, TypeError, RecursionError, zstandard.ZstdError) as exc:
        raise CodecError(f"commit-metadata mirror is corrupt: {text[:24]!r}...") from exc
