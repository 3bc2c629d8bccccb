"""The commit-metadata mirror: a partition's open ranges as short ASCII text, and its marker.

The open ranges of a partition are mirrored into the primary's Kafka commit metadata, which brokers
cap at ``offset.metadata.max.bytes`` (4096 by default), so that they outlive the loss of the store.
Each row is ``[start, end, committed, completion map]`` (:mod:`fastrecover.completion_map`); the
JSON rows are compressed with zstd when that pays and base64'd. Decoding is strict: a malformed text
raises ``CodecError`` rather than yielding wrong ranges, which could skip records.

The mirror is *untrusted input*: anyone allowed to commit offsets for the group writes the metadata
we read back. :func:`decode_mirror` therefore bounds every size an attacker could choose
(decompressed bytes, rows, completion-map offsets, offset values) *before* it allocates anything
proportional to it, merges duplicate and overlapping rows, and, when a mirror key is configured,
ignores metadata that does not carry a valid HMAC. What recovery then does with a decoded mirror
(``fastrecover.recovery``) costs duplicates at worst, never a skipped record.

**The marker** (``fr2:<lineage>/<offset>:<mirror>``) is what fastrecover writes today: the ``fr1``
mirror behind a header naming the *lineage* (cluster id and a nonce, see :mod:`fastrecover.recovery`)
and the very offset it was committed with.  It is how a later recovery tells "Kafka's committed
offset was written by fastrecover, and the ranges of this lineage still describe it" from "someone
else moved the offset" (an operator's reset, a re-created topic, a plain member).  A signed marker
binds the header too, so a copied signature cannot vouch for another offset.  Plain ``fr1:`` text
(older versions) is still read.  Signatures are :mod:`fastrecover.signing`'s.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from fastrecover.completion_map import (
    MIN_COMPRESSED_BYTES,
    compress,
    decode_completed_sized,
    decompress,
    encode_completed,
    zstd_error,
)
from fastrecover.errors import CodecError
from fastrecover.ranges import RangeProgress
from fastrecover.values import value

_MIRROR_PREFIX = "fr1:"
_MARKER_PREFIX = "fr2:"
#: the header's lineage: a Kafka cluster id (base64url, 22 characters in practice) and a 16-hex nonce
_CLUSTER_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
CLUSTER_MAX = 64
_NONCE_CHARS = frozenset("0123456789abcdef")
_DIGITS = frozenset("0123456789")
NONCE_LEN = 16
#: room the header and a signature take in front of a mirror: ``fr2:`` + cluster + ``/`` + nonce + ``/``
#: + a 19-digit offset + ``:``, and ``S`` + MAC + ``.``
_HEADER_MAX = len(_MARKER_PREFIX) + CLUSTER_MAX + 1 + NONCE_LEN + 1 + 19 + 1
_SIGNATURE_MAX = 2 + 24
_SIGNED = "S"  # marks a signed mirror: ``fr1:S<mac>.<body>``
_MAC_CHARS = 24  # base64 of 16 bytes, with padding
#: librdkafka/broker default offset.metadata.max.bytes is 4096; keep a margin.
MIRROR_LIMIT = 4000
#: Offsets are signed 64-bit in Kafka and in the store (BIGINT): every mirrored offset is below this.
OFFSET_LIMIT = 2**63 - 1
#: Decompressed-size cap of a mirror body. A mirror is at most MIRROR_LIMIT characters, and
#: everything encode_mirror writes decompresses to far less than this.
MIRROR_MAX_DECOMPRESSED = 64 * 1024
#: Most rows (open ranges) one mirror may hold; encode_mirror merges neighbours to stay within it.
MIRROR_MAX_ROWS = 128
#: Most completed offsets all completion maps of one mirror may decode to together.
MIRROR_MAX_COMPLETED = 2_048


def encode_mirror(
    ranges: Sequence[RangeProgress],
    limit: int = MIRROR_LIMIT,
    *,
    key: bytes | None = None,
    context: str = "",
) -> str:
    """Mirror a partition's open ranges into commit metadata, fitting in ``limit`` (see :func:`encode_mirror_full`)."""
    return encode_mirror_full(ranges, limit, key=key, context=context)[0]


def encode_mirror_full(
    ranges: Sequence[RangeProgress],
    limit: int = MIRROR_LIMIT,
    *,
    key: bytes | None = None,
    context: str = "",
) -> tuple[str, bool]:
    """Mirror a partition's open ranges into commit metadata, fitting in ``limit``; and whether it is whole.

    The flag is False when the text had to degrade (below) to fit: the caller counts those
    without decoding what it just encoded.

    When the full form does not fit (or holds more than ``MIRROR_MAX_ROWS``
    rows), degrade in ways that can only cause re-delivery, never loss: first
    drop the completion maps (their offsets are backfilled again), then merge
    neighbouring ranges into covering ranges (the gap between them, already
    read by the primary, is re-read too).

    With ``key``, the mirror is signed (HMAC-SHA256 over ``context`` and the
    body, truncated to 128 bits) so that :func:`decode_mirror` with the same key
    ignores anything else.  ``context`` binds the signature to where the mirror
    is written (e.g. group, topic and partition), so a signed mirror copied to
    another partition is refused too.
    """
    entries = sorted((r for r in ranges if not r.done), key=lambda r: r.start)
    if not entries:
        return "", True

    def fits(text: str) -> bool:
        return len(text) <= limit

    def render(rows: Sequence[RangeProgress], with_maps: bool) -> str:
        return _sign(_mirror_text(rows, with_maps=with_maps), key, context)

    text = render(entries, True) if len(entries) <= MIRROR_MAX_ROWS else ""
    if text and fits(text) and _maps_within_cap(entries):
        return text, True
    entries = [RangeProgress(r.start, r.end, r.committed) for r in entries]
    while len(entries) > MIRROR_MAX_ROWS:
        _merge_closest(entries)
    text = render(entries, False)
    while not fits(text) and len(entries) > 1:
        _merge_closest(entries)
        text = render(entries, False)
    if not fits(text):
        raise ValueError(f"mirror of one range does not fit in {limit} characters")
    return text, False


def _merge_closest(entries: list[RangeProgress]) -> None:
    """Merge the two neighbours with the smallest gap into one covering range, in place.

    Cover both (even if they overlap or nest): everything from the lower committed
    offset to the higher end is re-delivered, so nothing unfinished is dropped.
    """
    gaps = [entries[i + 1].start - entries[i].end for i in range(len(entries) - 1)]
    i = gaps.index(min(gaps))
    a, b = entries[i], entries[i + 1]
    entries[i : i + 2] = [RangeProgress(a.start, max(a.end, b.end), min(a.committed, b.committed))]


def _maps_within_cap(entries: Sequence[RangeProgress]) -> bool:
    return sum(len(r.completed) for r in entries) <= MIRROR_MAX_COMPLETED


def _mirror_text(entries: Sequence[RangeProgress], with_maps: bool) -> str:
    # What json.dumps(rows, separators=(",", ":")) writes, at a fraction of its cost: the fields are
    # ints and completion maps, whose characters (base64 and a tag) JSON never escapes.
    rows = ",".join(
        f'[{r.start:d},{r.end:d},{r.committed:d},"{encode_completed(r.committed, r.completed) if with_maps else ""}"]'
        for r in entries
    )
    raw = f"[{rows}]".encode("ascii")
    packed = compress(raw) if len(raw) >= MIN_COMPRESSED_BYTES else raw
    if len(packed) < len(raw):
        return _MIRROR_PREFIX + "Z" + base64.b64encode(packed).decode("ascii")
    return _MIRROR_PREFIX + "J" + base64.b64encode(raw).decode("ascii")


def _mac(key: bytes, context: str, body: str) -> str:
    from fastrecover import signing  # OpenSSL's load, only once a mirror is signed (signing.py)

    return signing.mac(key, context, body)


def sign_mirror(text: str, key: bytes | None, context: str) -> str:
    """An unsigned ``fr1`` mirror signed with ``key`` for ``context`` (unchanged without a key, or when empty)."""
    return _sign(text, key, context) if text else text


def _sign(text: str, key: bytes | None, context: str) -> str:
    if key is None:
        return text
    body = text[len(_MIRROR_PREFIX) :]
    return f"{_MIRROR_PREFIX}{_SIGNED}{_mac(key, context, body)}.{body}"


def is_mirror(text: str | None) -> bool:
    """Whether metadata is fastrecover's own (a mirror or a marker), never the application's."""
    return bool(text) and str(text).startswith((_MIRROR_PREFIX, _MARKER_PREFIX))


#: the mirror limit left for the ``fr1`` text inside a marker
MARKED_MIRROR_LIMIT = MIRROR_LIMIT - _HEADER_MAX - _SIGNATURE_MAX


def check_lineage(lineage: str) -> str:
    """``lineage`` if it is ``<cluster>/<nonce>`` as :func:`new_lineage` makes it; ValueError otherwise."""
    cluster, slash, nonce = lineage.rpartition("/")
    if (
        not slash
        or len(cluster) > CLUSTER_MAX
        or not set(cluster) <= _CLUSTER_CHARS
        or len(nonce) != NONCE_LEN
        or not set(nonce) <= _NONCE_CHARS
    ):
        raise ValueError(f"lineage {lineage!r} is not <cluster id>/<{NONCE_LEN} hex digits>")
    return lineage


def cluster_label(cluster_id: str | None) -> str:
    """The cluster part of a lineage: the broker's cluster id, or a digest of it if it has other characters."""
    text = cluster_id or ""
    if len(text) <= CLUSTER_MAX and set(text) <= _CLUSTER_CHARS:
        return text
    from fastrecover.signing import digest  # see _mac

    return digest(text)


def new_lineage(cluster_id: str | None, nonce: bytes) -> str:
    """A lineage of ``cluster_id`` from 8 random bytes (the caller draws them: this module does no I/O)."""
    if len(nonce) != NONCE_LEN // 2:
        raise ValueError(f"a lineage nonce is {NONCE_LEN // 2} bytes, got {len(nonce)}")
    return f"{cluster_label(cluster_id)}/{nonce.hex()}"


def lineage_cluster(lineage: str) -> str:
    """The cluster part of a lineage."""
    return lineage.rpartition("/")[0]


def mark(mirror: str, lineage: str, offset: int, *, key: bytes | None = None, context: str = "") -> str:
    """Commit metadata for ``offset``: the header, then ``mirror`` (unsigned ``fr1`` text, or '').

    ``mirror`` comes from :func:`encode_mirror` with ``limit=MARKED_MIRROR_LIMIT`` and no key;
    with ``key`` it is signed here, over ``context`` and the header, so that the signature
    vouches for this lineage at this offset only.
    """
    if not 0 <= offset < OFFSET_LIMIT:
        raise ValueError(f"offset {offset} cannot be marked")
    header = f"{_MARKER_PREFIX}{check_lineage(lineage)}/{offset}"
    body = mirror[len(_MIRROR_PREFIX) :] if mirror else ""
    if key is not None and body:
        body = f"{_SIGNED}{_mac(key, _marked_context(context, header), body)}.{body}"
    return f"{header}:{body}"


def _marked_context(context: str, header: str) -> str:
    return f"{context}|{header}"


@value
class Marker:
    """What commit metadata says about the offset it was committed with.

    ``lineage`` None: the metadata is an older version's ``fr1`` mirror, with no lineage
    and no offset of its own.
    """

    lineage: str | None
    offset: int | None
    ranges: tuple[RangeProgress, ...]


def read_marker(text: str | None, *, key: bytes | None = None, context: str = "") -> Marker | None:
    """The marker (or old mirror) in commit metadata; None for metadata that is not fastrecover's.

    Raises ``CodecError`` for metadata that claims to be fastrecover's and is malformed, or whose
    signature does not verify: such metadata vouches for nothing.
    """
    if not isinstance(text, str):
        return None
    if text.startswith(_MIRROR_PREFIX):
        return Marker(None, None, tuple(decode_mirror(text, key=key, context=context)))
    if not text.startswith(_MARKER_PREFIX):
        return None
    header, colon, body = text[len(_MARKER_PREFIX) :].partition(":")
    if not colon:
        raise CodecError(f"commit-metadata marker {text[:48]!r} has no ':' after its header")
    lineage, slash, offset_text = header.rpartition("/")
    digits = bool(offset_text) and set(offset_text) <= _DIGITS
    if not slash or not digits or len(offset_text) > 19 or (offset_text[0] == "0" and offset_text != "0"):
        raise CodecError(f"commit-metadata marker {text[:48]!r} has no valid offset in its header")
    try:
        check_lineage(lineage)
    except ValueError as exc:
        raise CodecError(f"commit-metadata marker {text[:48]!r}: {exc}") from None
    offset = int(offset_text)
    if offset >= OFFSET_LIMIT:
        raise CodecError(f"commit-metadata marker {text[:48]!r} has an offset beyond {OFFSET_LIMIT}")
    ranges: list[RangeProgress] = []
    if key is not None and not body:
        raise CodecError("commit-metadata marker is unsigned but a mirror key is configured; ignored")
    if body:
        full_header = f"{_MARKER_PREFIX}{header}"
        ranges = decode_mirror(_MIRROR_PREFIX + body, key=key, context=_marked_context(context, full_header))
    return Marker(lineage, offset, tuple(ranges))


def _verified_body(text: str, key: bytes | None, context: str) -> str:
    """The mirror body (``Z...`` or ``J...``) after the signature check."""
    body = text[len(_MIRROR_PREFIX) :]
    signed = body[:1] == _SIGNED
    if signed:
        mac, dot, rest = body[1 : 1 + _MAC_CHARS], body[1 + _MAC_CHARS : 2 + _MAC_CHARS], body[2 + _MAC_CHARS :]
        if dot != "." or len(mac) != _MAC_CHARS:
            raise CodecError("signed commit-metadata mirror is malformed")
        if key is not None:
            from fastrecover import signing  # see _mac: a reader without a key never loads it

            if not signing.matches(mac, key, context, rest):
                raise CodecError("commit-metadata mirror is not signed with the configured mirror key; ignored")
        return rest
    if key is not None:
        raise CodecError("commit-metadata mirror is unsigned but a mirror key is configured; ignored")
    return body


def _shape_ok(raw: bytes) -> bool:
    """A cheap (C-speed) pre-check before json.loads sees hostile bytes.

    A mirror is a list of rows whose only strings are base64 completion maps, so
    it holds exactly one '[' per row plus one and no '{' at all.  Counting them
    bounds both the row count and the nesting depth before anything is parsed.
    """
    return raw.count(b"[") <= MIRROR_MAX_ROWS + 1 and b"{" not in raw


def decode_mirror(text: str, *, key: bytes | None = None, context: str = "") -> list[RangeProgress]:
    """Ranges mirrored by :func:`encode_mirror`; '' or foreign metadata gives [].

    Strict and bounded (see the module docstring): every offset in
    ``[0, OFFSET_LIMIT)``, at most ``MIRROR_MAX_ROWS`` rows and
    ``MIRROR_MAX_COMPLETED`` completed offsets, a body of at most
    ``MIRROR_MAX_DECOMPRESSED`` bytes.  Duplicate and overlapping rows are merged
    into one covering range whose committed offset is the lowest of theirs (an
    offset counts as done only if every row holding it says so), sorted by start.
    Raises only ``CodecError``.
    """
    if not isinstance(text, str) or not text.startswith(_MIRROR_PREFIX):
        return []
    try:
        body = _verified_body(text, key, context)
        raw = base64.b64decode(body[1:], validate=True)
        if body[:1] == "Z":
            raw = decompress(raw, MIRROR_MAX_DECOMPRESSED)
        elif body[:1] != "J":
            raise CodecError(f"unknown mirror encoding {body[:1]!r}")
        if len(raw) > MIRROR_MAX_DECOMPRESSED:
            raise CodecError(f"commit-metadata mirror of {len(raw)} bytes exceeds {MIRROR_MAX_DECOMPRESSED}")
        if not _shape_ok(raw):
            raise CodecError(
                f"commit-metadata mirror has more than {MIRROR_MAX_ROWS} rows, or nesting or objects it never has"
            )
        import json  # only a mirror with ranges needs it, not the mode's import (startup.py)

        rows = json.loads(raw)
        if not isinstance(rows, list):
            raise CodecError(f"commit-metadata mirror is not a list of ranges: {text[:24]!r}...")
        if len(rows) > MIRROR_MAX_ROWS:
            raise CodecError(f"commit-metadata mirror has {len(rows)} rows, more than the {MIRROR_MAX_ROWS} allowed")
        ranges: list[RangeProgress] = []
        budget = MIRROR_MAX_COMPLETED
        # one byte budget for the body and every map in it: 128 rows may not each decompress a full body
        byte_budget = MIRROR_MAX_DECOMPRESSED - len(raw)
        for row in rows:
            progress, used = _decode_row(row, budget, byte_budget)
            budget -= len(progress.completed)
            byte_budget -= used
            ranges.append(progress)
        return _merge_rows(ranges)
    except CodecError:
        raise
    except (binascii.Error, ValueError, TypeError, RecursionError, MemoryError, zstd_error()) as exc:
        raise CodecError(f"commit-metadata mirror is corrupt: {text[:24]!r}...") from exc


def _decode_row(row: object, budget: int, byte_budget: int) -> tuple[RangeProgress, int]:
    if not isinstance(row, list) or len(row) != 4:
        raise CodecError(f"commit-metadata mirror row {_clip(row)} is not [start, end, committed, map]")
    s, e, c, m = row
    if not all(type(v) is int for v in (s, e, c)) or not isinstance(m, str):
        raise CodecError(f"commit-metadata mirror row {_clip(row)} has a field of the wrong type")
    if not 0 <= s <= c <= e < OFFSET_LIMIT:
        raise CodecError(
            f"commit-metadata mirror row {_clip(row)} needs 0 <= start <= committed <= end < {OFFSET_LIMIT}"
        )
    completed, used = decode_completed_sized(c, m, end=e, max_offsets=budget, max_bytes=max(byte_budget, 0))
    return RangeProgress(s, e, c, completed), used


def _merge_rows(ranges: list[RangeProgress]) -> list[RangeProgress]:
    """Sort; merge duplicates and overlaps conservatively; drop empty and finished rows."""
    merged: list[RangeProgress] = []
    for r in sorted((r for r in ranges if r.end > r.start), key=lambda r: (r.start, r.end)):
        last = merged[-1] if merged else None
        if last is not None and r.start < last.end:
            if r == last:
                continue
            # Below min(committed) every row that holds an offset says it is done; maps are dropped.
            merged[-1] = RangeProgress(last.start, max(last.end, r.end), min(last.committed, r.committed))
        else:
            merged.append(r)
    return [r for r in merged if not r.done]


def _clip(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
