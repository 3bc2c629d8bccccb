"""The commit-metadata mirror decoder against the payloads of issue 11 and fuzzed input.

Every input must either decode to a small, valid, merged list of ranges inside
the documented limits, or raise CodecError; never another exception, never
memory or time proportional to a number the attacker chose.
"""

from __future__ import annotations

import base64
import json
import time
import tracemalloc
from itertools import pairwise

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrecover.codec import (
    MIRROR_LIMIT,
    MIRROR_MAX_COMPLETED,
    MIRROR_MAX_DECOMPRESSED,
    MIRROR_MAX_ROWS,
    OFFSET_LIMIT,
    decode_mirror,
    encode_mirror,
)
from fastrecover.completion_map import decode_completed, encode_completed
from fastrecover.errors import CodecError
from fastrecover.ranges import RangeProgress
from tests.security.payloads import mirror, payloads

#: Generous bounds for one decode: far below what the issue measured (1.1 GiB, 12 s).
MAX_PEAK_BYTES = 32 * 1024 * 1024
MAX_SECONDS = 2.0


def _decode_bounded(text: str, **kwargs: object) -> list[RangeProgress] | CodecError:
    tracemalloc.start()
    began = time.monotonic()
    try:
        result: list[RangeProgress] | CodecError = decode_mirror(text, **kwargs)  # type: ignore[arg-type]
    except CodecError as exc:
        result = exc
    finally:
        took = time.monotonic() - began
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MAX_PEAK_BYTES, f"decoding allocated {peak} bytes"
    assert took < MAX_SECONDS, f"decoding took {took:.2f} s"
    return result


def _check_valid(ranges: list[RangeProgress]) -> None:
    assert len(ranges) <= MIRROR_MAX_ROWS
    assert sum(len(r.completed) for r in ranges) <= MIRROR_MAX_COMPLETED
    for r in ranges:
        assert 0 <= r.start <= r.committed < r.end < OFFSET_LIMIT
    for a, b in pairwise(ranges):
        assert a.end <= b.start  # merged: no overlaps, sorted


REFUSED = {
    "run map of 5M offsets",
    "bitset map of 4.8M offsets",
    "bitset map within the size cap",
    "range of length 2^63",
    "offsets above BIGINT",
    "negative offsets",
    "5,000 identical rows",
    "2M identical rows",
    "deep json",
    "zstd bomb",
    "not base64",
    "garbage",
}


@pytest.mark.parametrize("name", sorted(payloads(2_000)))
def test_issue_payload(name: str) -> None:
    text = payloads(2_000)[name]
    assert len(text) <= 4096  # each fits the broker's offset.metadata.max.bytes
    result = _decode_bounded(text)
    if name in REFUSED:
        assert isinstance(result, CodecError), f"{name} decoded to {result!r}"
        return
    assert isinstance(result, list)
    _check_valid(result)


def test_duplicates_are_merged() -> None:
    assert decode_mirror(mirror([[0, 2_000, 0, ""]] * 100)) == [RangeProgress(0, 2_000, 0)]


def test_overlaps_merge_to_the_lowest_committed() -> None:
    decoded = decode_mirror(mirror([[0, 1_000, 999, ""], [500, 2_000, 1_999, ""], [2_000, 2_100, 2_000, ""]]))
    assert decoded == [RangeProgress(0, 2_000, 999), RangeProgress(2_000, 2_100, 2_000)]


@pytest.mark.parametrize("offset", [OFFSET_LIMIT, OFFSET_LIMIT + 1, 2**64, 10**30])
def test_offsets_at_or_above_the_limit_are_refused(offset: int) -> None:
    with pytest.raises(CodecError):
        decode_mirror(mirror([[0, offset, 0, ""]]))
    assert decode_mirror(mirror([[0, OFFSET_LIMIT - 1, 0, ""]])) == [RangeProgress(0, OFFSET_LIMIT - 1, 0)]


def test_row_cap_and_encoder_agree() -> None:
    many = [RangeProgress(i * 10, i * 10 + 5, i * 10) for i in range(MIRROR_MAX_ROWS * 3)]
    text = encode_mirror(many, limit=10**9)
    decoded = decode_mirror(text)
    assert len(decoded) <= MIRROR_MAX_ROWS
    unfinished = {o for r in many for o in range(r.committed, r.end)}
    assert unfinished <= {o for r in decoded for o in range(r.committed, r.end) if o not in r.completed}


def test_encoder_output_is_always_decodable_within_caps() -> None:
    huge_map = RangeProgress(0, 10**9, 0, frozenset(range(1, MIRROR_MAX_COMPLETED + 50, 1)))
    text = encode_mirror([huge_map])
    assert len(text) <= MIRROR_LIMIT
    assert decode_mirror(text) == [RangeProgress(0, 10**9, 0)]


# ---- HMAC ----------------------------------------------------------------------------------------

KEY = b"k" * 32


class TestSignedMirror:
    ranges = [RangeProgress(10, 50, 20, frozenset({30})), RangeProgress(60, 90, 60)]

    def test_round_trip(self) -> None:
        text = encode_mirror(self.ranges, key=KEY, context="g/t/0")
        assert decode_mirror(text, key=KEY, context="g/t/0") == self.ranges

    def test_unsigned_mirror_is_refused_when_a_key_is_set(self) -> None:
        with pytest.raises(CodecError, match="unsigned"):
            decode_mirror(encode_mirror(self.ranges), key=KEY)

    def test_foreign_key_is_refused(self) -> None:
        text = encode_mirror(self.ranges, key=b"other", context="g/t/0")
        with pytest.raises(CodecError, match="not signed with the configured"):
            decode_mirror(text, key=KEY, context="g/t/0")

    def test_copied_to_another_partition_is_refused(self) -> None:
        text = encode_mirror(self.ranges, key=KEY, context="g/t/0")
        with pytest.raises(CodecError):
            decode_mirror(text, key=KEY, context="g/t/1")

    def test_tampered_body_is_refused(self) -> None:
        text = encode_mirror(self.ranges, key=KEY)
        forged = text[: text.index(".") + 1] + mirror([[0, 2_000, 1_999, ""]])[4:]
        with pytest.raises(CodecError):
            decode_mirror(forged, key=KEY)

    def test_signed_mirror_fits_the_limit(self) -> None:
        many = [RangeProgress(i * 1_000, i * 1_000 + 7, i * 1_000 + 1) for i in range(2_000)]
        assert len(encode_mirror(many, key=KEY)) <= MIRROR_LIMIT


# ---- fuzzing -------------------------------------------------------------------------------------

ints = st.one_of(
    st.integers(-10, 5_000), st.integers(0, 2**64), st.sampled_from([OFFSET_LIMIT - 1, OFFSET_LIMIT, 2**63 + 1])
)
maps = st.one_of(
    st.just(""),
    st.text(max_size=40),
    st.builds(lambda b, t: "1" + t + base64.b64encode(b).decode(), st.binary(max_size=64), st.sampled_from("bBrRx")),
)
rows = st.lists(
    st.one_of(
        st.tuples(ints, ints, ints, maps).map(list),
        st.lists(st.one_of(ints, st.text(max_size=5), st.none(), st.floats()), max_size=6),
        st.none(),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows, st.booleans())
def test_fuzzed_rows(fuzzed: list[object], compress: bool) -> None:
    result = _decode_bounded(mirror(fuzzed, compress=compress))
    if isinstance(result, list):
        _check_valid(result)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3_000), st.sampled_from(["J", "Z", "S", "X", ""]), st.booleans())
def test_fuzzed_bytes(raw: bytes, tag: str, compress: bool) -> None:
    body = zstandard.ZstdCompressor(level=1).compress(raw) if compress else raw
    result = _decode_bounded("fr1:" + tag + base64.b64encode(body).decode())
    if isinstance(result, list):
        _check_valid(result)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=4_000))
def test_fuzzed_text(text: str) -> None:
    for candidate in (text, "fr1:" + text, "fr1:Z" + text, "fr1:J" + text):
        result = _decode_bounded(candidate)
        if isinstance(result, list):
            _check_valid(result)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 8 * MIRROR_MAX_DECOMPRESSED), st.sampled_from([b"[", b" ", b"\xff", b'[0,1,0,""],']))
def test_fuzzed_compression_sizes(size: int, unit: bytes) -> None:
    raw = (unit * (size // len(unit) + 1))[:size]
    for level in (1, 6):
        packed = zstandard.ZstdCompressor(level=level, write_content_size=level == 1).compress(raw)
        result = _decode_bounded("fr1:Z" + base64.b64encode(packed).decode())
        if size > MIRROR_MAX_DECOMPRESSED:
            assert isinstance(result, CodecError)


def test_json_with_huge_numbers_is_bounded() -> None:
    raw = json.dumps([[int("9" * 4_000), 1, 1, ""]]).encode()
    assert isinstance(_decode_bounded("fr1:J" + base64.b64encode(raw).decode()), CodecError)


# ---- one budget for a whole mirror ----------------------------------------------------------------


def _zstd_bitset(raw: bytes) -> str:
    return "1B" + base64.b64encode(zstandard.ZstdCompressor(level=19).compress(raw)).decode()


def test_the_issue_payload_is_refused_by_the_mirrors_byte_budget() -> None:
    """128 rows, each a zstd bitset of 256 KiB with one bit set: 117 characters of metadata per row."""
    one_bit = _zstd_bitset(bytes(256 * 1024 - 1) + b"\x01")
    rows = [[i * 10**7, i * 10**7 + 5 * 10**6, i * 10**7, one_bit] for i in range(128)]
    with pytest.raises(CodecError, match=r"more than the .* allowed"):
        decode_mirror(mirror(rows))


def test_the_rows_of_a_mirror_share_one_byte_budget() -> None:
    # each map alone fits the budget; together they do not
    each = MIRROR_MAX_DECOMPRESSED // 4
    dense = _zstd_bitset(b"\xff" * each)
    rows = [[i * 10**7, i * 10**7 + 8 * each + 10, i * 10**7, dense] for i in range(5)]
    with pytest.raises(CodecError):
        decode_mirror(mirror(rows))


def test_a_bitset_longer_than_its_highest_bit_needs_is_refused() -> None:
    with pytest.raises(CodecError, match="longer than its highest set bit needs"):
        decode_completed(0, "1b" + base64.b64encode(b"\x01\x00").decode(), end=100)


def test_a_bitset_sparser_than_any_encoder_writes_is_refused() -> None:
    sparse = bytes(999) + b"\x01"  # one offset: the run-length form is 2 bytes
    with pytest.raises(CodecError, match="sparser than any encoder writes"):
        decode_completed(0, "1b" + base64.b64encode(sparse).decode(), end=10_000)


@given(st.frozensets(st.integers(1, 5_000), min_size=1, max_size=300))
def test_every_map_the_encoder_writes_passes_the_checks(completed: frozenset[int]) -> None:
    assert decode_completed(0, encode_completed(0, completed), end=5_001) == completed
