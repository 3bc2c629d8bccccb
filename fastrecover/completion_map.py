"""Completion maps: the offsets finished out of order above a range's committed offset, as short ASCII.

A range's progress is its committed offset plus the set of offsets above it
that finished out of order; that set is stored in the token row and carried in
the commit-metadata mirror (:mod:`fastrecover.codec`), so it must be short
text.  Like the Confluent Parallel Consumer we encode it both as a bitset and
as run lengths, keep the smaller, compress with zstd when that pays, and base64
the result.  Decoding is strict and bounded: a malformed map raises
``CodecError`` rather than yielding a wrong set (a wrong set could skip
records), and every size is checked before anything proportional to it is
allocated, since a mirror's maps are untrusted input.  Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from fastrecover.errors import CodecError

if TYPE_CHECKING:
    import zstandard

_VERSION = "1"
#: zstd level of completion maps and mirrors: fast, and these payloads are small.
ZSTD_LEVEL = 3
#: Payloads shorter than this are never compressed: a zstd frame spends about a dozen bytes on its
#: headers, so it seldom pays, and the first mirror of a recovery (a range or two, no map) then needs
#: neither zstandard's import (about 5 ms of CPU) nor a compressor on the way to the first fresh record.
MIN_COMPRESSED_BYTES = 64
#: Decompressed-size cap of a completion map read from the store (a trusted, operator-owned input).
_MAX_DECOMPRESSED = 16 * 1024 * 1024
#: A bitset is written only when it is no longer than the run-length form, which takes at most 20
#: bytes (two 10-byte varints) per run, so at most 20 per set bit: a longer one is no encoder's.
_BITSET_BYTES_PER_BIT = 20
#: the bytes of a bitset that hold a set bit, found at C speed
_NONZERO = re.compile(b"[^\x00]")


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


def _zstd() -> Any:
    """zstandard, imported at its first use.

    Its import (with the ``platform`` module it loads) costs about 5 ms of CPU, and a mode-on
    consumer's start imports the codec while its group join runs: a restart whose commits carry
    no compressed mirror never needs it.
    """
    import zstandard

    return zstandard


def zstd_error() -> type[Exception]:
    """zstandard's error class, for an ``except`` clause (evaluated only when an exception reaches it)."""
    error: type[Exception] = _zstd().ZstdError
    return error


#: compressors not in use; a caller takes one out and puts it back (list.pop and append are atomic)
_idle: list[zstandard.ZstdCompressor] = []


def compress(raw: bytes) -> bytes:
    """zstd at ``ZSTD_LEVEL``, with a compressor no other thread is using.

    Making a compressor costs several times more than compressing a mirror with it, and a
    recovery encodes one mirror per partition.  A compressor is not for two threads at once
    (the Spark commit-mirror thread encodes too): each call takes one out of the idle pool
    and puts it back, so the pool holds as many as ever ran at the same time.  Its output
    does not depend on what it compressed before.
    """
    try:
        compressor = _idle.pop()
    except IndexError:
        compressor = _zstd().ZstdCompressor(level=ZSTD_LEVEL)
    try:
        return compressor.compress(raw)
    finally:
        _idle.append(compressor)


def decompress(raw: bytes, limit: int = _MAX_DECOMPRESSED) -> bytes:
    """zstd-decompress at most ``limit`` bytes.

    ``max_output_size`` only applies to frames that do not declare their size, so a
    frame declaring a huge content size is refused here before anything is allocated.
    A frame that declares a small size but holds more is refused by the decompressor.
    """
    zstd = _zstd()
    size = zstd.frame_content_size(raw)
    if size > limit:
        raise CodecError(f"zstd payload declares {size} bytes, more than the {limit} allowed")
    data: bytes = zstd.ZstdDecompressor().decompress(raw, max_output_size=limit)
    if len(data) > limit:  # pragma: no cover - the decompressor enforces max_output_size
        raise CodecError(f"zstd payload decompresses to more than the {limit} bytes allowed")
    return data


def _bits(raw: bytes, base: int) -> set[int]:
    """The offsets a bitset holds; only its non-zero bytes are visited (found at C speed)."""
    out: set[int] = set()
    for found in _NONZERO.finditer(raw):
        i = found.start()
        byte = raw[i]
        out.update(base + (i << 3) + bit for bit in range(8) if byte >> bit & 1)
    return out


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
    if not completed:  # a range finished in order (every new range): no set, no sort
        return ""
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
    packed = compress(raw) if len(raw) >= MIN_COMPRESSED_BYTES else raw
    if len(packed) < len(raw):
        tag, raw = tag.upper(), packed
    return _VERSION + tag + base64.b64encode(raw).decode("ascii")


def decode_completed(
    committed: int,
    text: str,
    end: int | None = None,
    *,
    max_offsets: int | None = None,
    max_bytes: int = _MAX_DECOMPRESSED,
) -> frozenset[int]:
    """Inverse of :func:`encode_completed`; raises ``CodecError`` on anything malformed.

    With ``end`` (the range's end), an offset at or beyond it is malformed too.
    ``max_offsets`` caps how many offsets the map may hold and ``max_bytes`` the
    decompressed payload.  Every check runs *before* a run or a bitset is
    expanded, so a corrupt or hostile map cannot make the decoder build a set
    larger than the caps.
    """
    return decode_completed_sized(committed, text, end, max_offsets=max_offsets, max_bytes=max_bytes)[0]


def decode_completed_sized(
    committed: int,
    text: str,
    end: int | None = None,
    *,
    max_offsets: int | None = None,
    max_bytes: int = _MAX_DECOMPRESSED,
) -> tuple[frozenset[int], int]:
    """:func:`decode_completed`, and the bytes the map decompressed to (a mirror's maps share one budget)."""
    if not text:
        return frozenset(), 0
    if not isinstance(text, str) or len(text) < 2 or text[0] != _VERSION or text[1] not in "bBrR":
        raise CodecError(f"unknown completion-map encoding {str(text)[:8]!r}")
    tag = text[1]
    try:
        raw = base64.b64decode(text[2:], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CodecError(f"completion map is not valid base64: {text[:16]!r}...") from exc
    if tag.isupper():
        try:
            raw = decompress(raw, max_bytes)
        except zstd_error() as exc:
            raise CodecError("completion map zstd payload is corrupt") from exc
    elif len(raw) > max_bytes:
        raise CodecError(f"completion map of {len(raw)} bytes is larger than the {max_bytes} allowed")
    base = committed + 1
    if tag.lower() == "b":
        if not raw:
            raise CodecError("completion-map bitset is empty")
        if end is not None and base + ((len(raw) - 1) << 3) >= end:
            raise CodecError(f"completion-map bitset of {len(raw)} bytes reaches beyond the range end {end}")
        if raw[-1] == 0:
            raise CodecError(f"completion-map bitset of {len(raw)} bytes is longer than its highest set bit needs")
        count = int.from_bytes(raw, "little").bit_count()
        if max_offsets is not None and count > max_offsets:
            raise CodecError(f"completion map holds {count} offsets, more than the {max_offsets} allowed")
        if len(raw) > _BITSET_BYTES_PER_BIT * (count + 1):
            raise CodecError(
                f"completion-map bitset of {len(raw)} bytes holds {count} offsets: sparser than any encoder writes"
            )
        offsets = _bits(raw, base)
        if end is not None and offsets and max(offsets) >= end:
            raise CodecError(f"completion map holds offset {max(offsets)} beyond the range end {end}")
    else:
        values = _read_varints(raw)
        if len(values) % 2:
            raise CodecError("run-length completion map has an odd number of runs")
        runs: list[tuple[int, int]] = []
        total = 0
        cursor = base
        for gap, length in zip(values[::2], values[1::2], strict=True):
            if length == 0:
                raise CodecError("run-length completion map has an empty run")
            cursor += gap
            if end is not None and cursor + length > end:
                raise CodecError(f"completion map run reaches offset {cursor + length - 1} beyond the range end {end}")
            total += length
            if max_offsets is not None and total > max_offsets:
                raise CodecError(f"completion map holds more than the {max_offsets} offsets allowed")
            runs.append((cursor, length))
            cursor += length
        offsets = set()
        for first, length in runs:
            offsets.update(range(first, first + length))
    if not offsets:
        raise CodecError("completion map decodes to an empty set")
    return frozenset(offsets), len(raw)
