"""Unit and property tests of the completion-map and commit-metadata mirror codecs (completion_map, codec)."""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrecover.codec import (
    CLUSTER_MAX,
    MARKED_MIRROR_LIMIT,
    MIRROR_LIMIT,
    MIRROR_MAX_COMPLETED,
    Marker,
    check_lineage,
    decode_mirror,
    encode_mirror,
    encode_mirror_full,
    is_mirror,
    mark,
    new_lineage,
    read_marker,
)
from fastrecover.codec import _mirror_text as _mirror_text
from fastrecover.completion_map import MIN_COMPRESSED_BYTES, compress, decode_completed, encode_completed
from fastrecover.errors import CodecError, FastRecoverError
from fastrecover.ranges import RangeProgress

# ---- strategies ------------------------------------------------------------------------------------

committed_offsets = st.integers(0, 2**40)


@st.composite
def completion_sets(draw: st.DrawFn) -> frozenset[int]:
    """Deltas above ``committed + 1`` in several shapes: sparse, dense, runs, huge gaps."""
    shape = draw(st.sampled_from(["sparse", "dense", "runs", "huge", "single"]))
    if shape == "sparse":
        return draw(st.frozensets(st.integers(0, 100_000), min_size=1, max_size=60))
    if shape == "dense":
        base = draw(st.integers(0, 50))
        width = draw(st.integers(1, 400))
        return draw(st.frozensets(st.integers(base, base + width), min_size=1, max_size=400))
    if shape == "runs":
        cursor = 0
        out: set[int] = set()
        for gap, length in draw(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 300)), min_size=1, max_size=12)):
            cursor += gap
            out.update(range(cursor, cursor + length))
            cursor += length + 1
        return frozenset(out)
    if shape == "huge":
        return draw(st.frozensets(st.integers(0, 2**50), min_size=1, max_size=20))
    return frozenset({draw(st.integers(0, 2**62))})


def _payload(text: str) -> bytes:
    """The raw bytes of a completion map (decompressed when zstd was used)."""
    raw = base64.b64decode(text[2:])
    if text[1].isupper():
        raw = zstandard.ZstdDecompressor().decompress(raw)
    return raw


def _with_payload(tag: str, raw: bytes, compress: bool = False) -> str:
    if compress:
        raw = zstandard.ZstdCompressor().compress(raw)
        tag = tag.upper()
    return "1" + tag + base64.b64encode(raw).decode("ascii")


# ---- completion maps -------------------------------------------------------------------------------


class TestCompletedRoundTrip:
    def test_empty(self) -> None:
        assert encode_completed(5, []) == ""
        assert decode_completed(5, "") == frozenset()

    def test_single_offset(self) -> None:
        text = encode_completed(10, [11])
        assert text.startswith("1")
        assert decode_completed(10, text) == frozenset({11})

    def test_relative_to_committed(self) -> None:
        text = encode_completed(100, {105, 107})
        assert decode_completed(100, text) == frozenset({105, 107})
        # the same text read against another committed offset shifts the set
        assert decode_completed(0, text) == frozenset({5, 7})

    def test_text_is_ascii_and_compact_for_long_runs(self) -> None:
        text = encode_completed(0, range(1, 1_000_001))
        assert text.isascii()
        assert len(text) < 40
        assert decode_completed(0, text) == frozenset(range(1, 1_000_001))

    def test_dense_half_full_uses_a_small_text(self) -> None:
        offsets = frozenset(range(1, 20_000, 2))
        text = encode_completed(0, offsets)
        assert len(text) < 20_000 // 8 * 2
        assert decode_completed(0, text) == offsets

    def test_offset_not_above_committed_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="not above committed"):
            encode_completed(10, [10])
        with pytest.raises(ValueError, match="not above committed"):
            encode_completed(10, [3, 20])

    def test_duplicates_in_input_are_harmless(self) -> None:
        text = encode_completed(0, [5, 5, 6, 9, 9])
        assert decode_completed(0, text) == frozenset({5, 6, 9})

    def test_huge_gap_does_not_build_a_huge_bitset(self) -> None:
        # a bitset for this would need 2**57 bytes
        text = encode_completed(0, [2**60, 2**60 + 1])
        assert len(text) < 40
        assert decode_completed(0, text) == frozenset({2**60, 2**60 + 1})

    @pytest.mark.parametrize("tag", ["b", "r"])
    def test_both_encodings_are_chosen_somewhere(self, tag: str) -> None:
        samples = [frozenset(range(1, 200, 3)), frozenset({1, 10_000})]
        tags = {encode_completed(0, s)[1].lower() for s in samples}
        assert tag in tags

    def test_zstd_used_when_it_pays(self) -> None:
        offsets = frozenset(o for o in range(1, 50_000) if o % 3 == 0)  # a long, repetitive bitset
        text = encode_completed(0, offsets)
        assert text[1].isupper()
        assert decode_completed(0, text) == offsets
        small = encode_completed(0, [1, 2, 3])
        assert small[1].islower()

    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
    @given(committed_offsets, completion_sets())
    def test_round_trip(self, committed: int, deltas: frozenset[int]) -> None:
        offsets = frozenset(committed + 1 + d for d in deltas)
        text = encode_completed(committed, offsets)
        assert text.isascii()
        assert text[0] == "1"
        assert text[1] in "bBrR"
        assert decode_completed(committed, text) == offsets

    @settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    @given(completion_sets())
    def test_smaller_raw_encoding_is_kept(self, deltas: frozenset[int]) -> None:
        text = encode_completed(0, {d + 1 for d in deltas})
        raw = _payload(text)
        # the other encoding would not have been shorter (bitset size is known exactly)
        bitset_len = max(deltas) // 8 + 1
        if text[1].lower() == "r":
            assert len(raw) <= bitset_len
        else:
            assert len(raw) == bitset_len


class TestCompletedStrictDecoding:
    @pytest.mark.parametrize(
        "text",
        [
            "x",
            "1",
            "2bAQ==",  # unknown version
            "0rAQE=",
            "1xAQ==",  # unknown tag
            "1b!!!!",  # not base64
            "1bAQ",  # bad padding
            "1bAQ==\n",
            "1b",  # empty payload
            "1bAAA=",  # bitset with no bit set
            "1r",  # no runs
            "1rAQ==",  # odd number of varints
            "1rgA==",  # truncated varint
            "1rAQA=",  # empty run
            "1B" + base64.b64encode(b"not zstd").decode(),
            "1R" + base64.b64encode(b"\x28\xb5\x2f\xfd garbage").decode(),
            "1r" + base64.b64encode(b"\xff" * 10 + b"\x01\x01").decode(),  # varint too long
        ],
    )
    def test_malformed_text_raises_codec_error(self, text: str) -> None:
        with pytest.raises(CodecError):
            decode_completed(0, text)

    def test_codec_error_is_ours_and_a_value_error(self) -> None:
        with pytest.raises(FastRecoverError):
            decode_completed(0, "zz")
        with pytest.raises(ValueError):
            decode_completed(0, "zz")

    def test_zstd_bomb_is_refused(self) -> None:
        bomb = zstandard.ZstdCompressor().compress(b"\xff" * (65 * 1024 * 1024))
        with pytest.raises(CodecError):
            decode_completed(0, "1B" + base64.b64encode(bomb).decode())

    def test_run_beyond_end_is_refused_before_it_is_built(self) -> None:
        raw = bytearray()
        for n in (0, 2**62):
            while True:
                b, n = n & 0x7F, n >> 7
                raw.append(b | (0x80 if n else 0))
                if not n:
                    break
        text = _with_payload("r", bytes(raw))
        with pytest.raises(CodecError, match="beyond"):
            decode_completed(0, text, end=1_000)

    def test_end_bounds_both_encodings(self) -> None:
        text_b = encode_completed(0, range(1, 200, 3))
        text_r = encode_completed(0, [1, 100_000])
        assert text_b[1].lower() == "b"
        assert text_r[1].lower() == "r"
        for text, top in ((text_b, 199), (text_r, 100_000)):
            assert max(decode_completed(0, text, end=top + 1)) == top
            with pytest.raises(CodecError):
                decode_completed(0, text, end=top)

    @settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(0, 1_000), completion_sets(), st.data())
    def test_truncated_text_never_adds_offsets(
        self, committed: int, deltas: frozenset[int], data: st.DataObject
    ) -> None:
        """Cutting a map short either fails or yields fewer offsets: never one that was not finished."""
        offsets = frozenset(committed + 1 + d for d in deltas)
        text = encode_completed(committed, offsets)
        cut = data.draw(st.integers(0, len(text) - 1))
        try:
            decoded = decode_completed(committed, text[:cut])
        except CodecError:
            return
        assert decoded < offsets

    @settings(max_examples=300)
    @given(st.text(max_size=40))
    def test_arbitrary_text_raises_codec_error_or_decodes_above_committed(self, text: str) -> None:
        try:
            decoded = decode_completed(7, text)
        except CodecError:
            return
        assert all(o > 7 for o in decoded)
        assert decoded or text == ""

    @settings(max_examples=200)
    @given(st.binary(max_size=40), st.sampled_from("bBrR"), st.booleans())
    def test_arbitrary_payload_raises_codec_error_or_decodes(self, raw: bytes, tag: str, pack: bool) -> None:
        if pack:
            raw = zstandard.ZstdCompressor().compress(raw)
        text = "1" + tag + base64.b64encode(raw).decode()
        try:
            decoded = decode_completed(3, text, end=100_000)
        except CodecError:
            return
        assert decoded
        assert min(decoded) > 3
        assert max(decoded) < 100_000
        if tag.lower() == "b":  # no end needed: a bitset is bounded by its size
            assert decode_completed(3, text) == decoded


# ---- the commit-metadata mirror --------------------------------------------------------------------


@st.composite
def open_partition_ranges(draw: st.DrawFn, max_ranges: int = 12) -> list[RangeProgress]:
    """Disjoint ranges of one partition with arbitrary progress."""
    count = draw(st.integers(0, max_ranges))
    cursor = draw(st.integers(0, 10_000))
    out: list[RangeProgress] = []
    for _ in range(count):
        cursor += draw(st.integers(0, 5_000))
        length = draw(st.integers(1, 3_000))
        start, end = cursor, cursor + length
        committed = draw(st.integers(start, end))
        completed = frozenset(
            draw(st.lists(st.integers(committed + 1, end - 1), max_size=60)) if end - committed > 1 else []
        )
        out.append(RangeProgress(start, end, committed, completed))
        cursor = end
    return draw(st.permutations(out))


def _maps_fit(ranges: list[RangeProgress]) -> bool:
    """Whether the completion maps are few enough for the full form (MIRROR_MAX_COMPLETED)."""
    return sum(len(r.completed) for r in ranges) <= MIRROR_MAX_COMPLETED


def unfinished(ranges: list[RangeProgress]) -> set[int]:
    return {o for r in ranges for o in range(r.committed, r.end) if o not in r.completed}


def _reference_mirror_text(ranges: list[RangeProgress], with_maps: bool) -> str:
    """The mirror text as json.dumps and a new zstd compressor write it; a short one is never compressed."""
    rows = [
        [r.start, r.end, r.committed, encode_completed(r.committed, r.completed) if with_maps else ""] for r in ranges
    ]
    raw = json.dumps(rows, separators=(",", ":")).encode("ascii")
    packed = zstandard.ZstdCompressor(level=3).compress(raw) if len(raw) >= MIN_COMPRESSED_BYTES else raw
    if len(packed) < len(raw):
        return "fr1:Z" + base64.b64encode(packed).decode("ascii")
    return "fr1:J" + base64.b64encode(raw).decode("ascii")


def test_compressors_shared_by_threads_write_what_a_new_one_writes() -> None:
    """The idle pool hands a compressor to one thread at a time: concurrent callers get correct frames."""
    payloads = [bytes(random.Random(seed).choices(b"[],0123456789", k=200 + seed)) for seed in range(64)]
    expected = [zstandard.ZstdCompressor(level=3).compress(p) for p in payloads]

    def work(_: int) -> list[bytes]:
        return [compress(p) for p in payloads for _ in range(5)][::5]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(16)))
    assert all(r == expected for r in results)


class TestMirror:
    @settings(max_examples=200, deadline=None)
    @given(ranges=open_partition_ranges(), with_maps=st.booleans())
    def test_text_is_what_json_and_a_new_compressor_write(self, ranges: list[RangeProgress], with_maps: bool) -> None:
        """The direct row formatting and the reused compressor change no byte of a mirror."""
        entries = sorted(ranges, key=lambda r: r.start)
        assert _mirror_text(entries, with_maps) == _reference_mirror_text(entries, with_maps)

    def test_empty(self) -> None:
        assert encode_mirror([]) == ""
        assert decode_mirror("") == []

    def test_done_ranges_are_not_mirrored(self) -> None:
        assert encode_mirror([RangeProgress(0, 10, 10)]) == ""

    def test_round_trip_sorted(self) -> None:
        ranges = [RangeProgress(140, 190, 150, frozenset({160, 161})), RangeProgress(70, 120, 70)]
        text = encode_mirror(ranges)
        assert is_mirror(text)
        assert text.isascii()
        assert decode_mirror(text) == sorted(ranges, key=lambda r: r.start)

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("", False),
            (None, False),
            ("fr1:", True),
            ("fr1:J", True),
            ("user metadata", False),
            ("FR1:J", False),
            (" fr1:J", False),
        ],
    )
    def test_is_mirror(self, text: str | None, expected: bool) -> None:
        assert is_mirror(text) is expected

    @pytest.mark.parametrize("text", ["some user metadata", "{}", "fr2:Jxx"])
    def test_foreign_metadata_decodes_to_nothing(self, text: str) -> None:
        assert decode_mirror(text) == []

    @staticmethod
    def _mirror_of(rows: object, compress: bool = False) -> str:
        raw = json.dumps(rows).encode()
        if compress:
            return "fr1:Z" + base64.b64encode(zstandard.ZstdCompressor().compress(raw)).decode()
        return "fr1:J" + base64.b64encode(raw).decode()

    @pytest.mark.parametrize(
        "text",
        [
            "fr1:",
            "fr1:X" + base64.b64encode(b"[]").decode(),
            "fr1:J!!!",
            "fr1:JW10",  # bad padding
            "fr1:Z" + base64.b64encode(b"not zstd").decode(),
            "fr1:J" + base64.b64encode(b"not json").decode(),
            "fr1:J" + base64.b64encode(b"\xff\xfe").decode(),
        ],
    )
    def test_corrupt_mirror_raises_codec_error(self, text: str) -> None:
        with pytest.raises(CodecError):
            decode_mirror(text)

    @pytest.mark.parametrize(
        "rows",
        [
            5,
            "abcd",
            {"a": 1},
            [[1, 2, 3]],  # too few fields
            [[1, 2, 3, "", 5]],
            [[10, 5, 5, ""]],  # end < start
            [[10, 20, 25, ""]],  # committed outside
            [[-1, 20, 5, ""]],
            [[10, 20, 10, "zz"]],  # bad completion map
            [[10, 20, 10, None]],
            [[10, 20, 10, 5]],
            [[10.5, 20, 11, ""]],  # non-integer offsets
            [[10, 20.9, 11, ""]],
            [[True, 20, 11, ""]],
            [["10", 20, 11, ""]],
            [[None, 20, 11, ""]],
        ],
    )
    @pytest.mark.parametrize("compress", [False, True])
    def test_malformed_rows_raise_codec_error(self, rows: object, compress: bool) -> None:
        with pytest.raises(CodecError):
            decode_mirror(self._mirror_of(rows, compress))

    def test_completion_map_beyond_end_raises(self) -> None:
        rows = [[10, 20, 10, encode_completed(10, [25])]]
        with pytest.raises(CodecError):
            decode_mirror(self._mirror_of(rows))

    def test_deep_json_raises_codec_error(self) -> None:
        raw = b"[" * 100_000 + b"]" * 100_000
        text = "fr1:Z" + base64.b64encode(zstandard.ZstdCompressor().compress(raw)).decode()
        with pytest.raises(CodecError):
            decode_mirror(text)

    def test_full_form_when_it_fits(self) -> None:
        ranges = [RangeProgress(0, 1_000, 10, frozenset(range(20, 900, 7)))]
        assert decode_mirror(encode_mirror(ranges)) == ranges

    def test_drops_completion_maps_first(self) -> None:
        scattered = frozenset(random.Random(7).sample(range(20, 90_000), 1_500))  # incompressible map
        ranges = [
            RangeProgress(0, 100_000, 10, scattered),
            RangeProgress(200_000, 300_000, 200_000),
        ]
        assert len(encode_mirror(ranges, limit=10**9)) > 200
        text = encode_mirror(ranges, limit=200)
        assert len(text) <= 200
        decoded = decode_mirror(text)
        assert decoded == [RangeProgress(0, 100_000, 10), RangeProgress(200_000, 300_000, 200_000)]

    def test_merges_neighbours_with_the_smallest_gap(self) -> None:
        ranges = [RangeProgress(a * 1_000, a * 1_000 + 100, a * 1_000 + 5) for a in range(40)]
        ranges.append(RangeProgress(39_150, 39_200, 39_160))  # only 50 past the last one
        full = encode_mirror(ranges)
        assert len(decode_mirror(full)) == 41
        text = encode_mirror(ranges, limit=len(full) - 1)
        decoded = decode_mirror(text)
        assert len(text) < len(full)
        assert len(decoded) < 41
        assert RangeProgress(39_000, 39_200, 39_005) in decoded
        assert unfinished(ranges) <= unfinished(decoded)

    def test_single_range_that_cannot_fit_raises(self) -> None:
        with pytest.raises(ValueError, match="does not fit"):
            encode_mirror([RangeProgress(0, 10, 0)], limit=5)

    def test_overlapping_input_never_loses_offsets(self) -> None:
        # not produced by the book, but a degraded mirror must stay conservative regardless
        ranges = [RangeProgress(0, 1_000, 100), RangeProgress(10, 20, 10), RangeProgress(5_000, 5_100, 5_000)]
        hull = encode_mirror([RangeProgress(0, 5_100, 10)], limit=10**9)
        for limit in range(len(hull), 120, 4):
            text = encode_mirror(ranges, limit=limit)
            assert len(text) <= limit
            assert unfinished(ranges) <= unfinished(decode_mirror(text))

    def test_default_limit_fits_broker_metadata(self) -> None:
        assert MIRROR_LIMIT <= 4096
        many = [
            RangeProgress(
                i * 10_000, i * 10_000 + 5_000, i * 10_000 + 3, frozenset(range(i * 10_000 + 10, i * 10_000 + 4_000, 3))
            )
            for i in range(300)
        ]
        text = encode_mirror(many)
        assert len(text) <= MIRROR_LIMIT
        assert unfinished(many) <= unfinished(decode_mirror(text))

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(open_partition_ranges(), st.sampled_from([60, 90, 150, 300, 600, 1_500, MIRROR_LIMIT]))
    def test_degradation_only_causes_redelivery(self, ranges: list[RangeProgress], limit: int) -> None:
        try:
            text = encode_mirror(ranges, limit=limit)
        except ValueError:
            # only allowed when not even one range covering them all would fit
            open_sorted = sorted((r for r in ranges if not r.done), key=lambda r: r.start)
            hull = RangeProgress(
                open_sorted[0].start, max(r.end for r in open_sorted), min(r.committed for r in open_sorted)
            )
            assert len(encode_mirror([hull], limit=10**9)) > limit
            return
        assert len(text) <= limit
        assert text.isascii()
        decoded = decode_mirror(text)
        open_ranges = [r for r in ranges if not r.done]
        assert (text == "") == (not open_ranges)
        # nothing unfinished is ever reported finished
        assert unfinished(open_ranges) <= unfinished(decoded)
        # decoded ranges are disjoint, sorted, not done, and cover only offsets inside the input's hull
        for a, b in pairwise(decoded):
            assert a.end <= b.start
        assert all(not r.done for r in decoded)
        if open_ranges:
            lo = min(r.start for r in open_ranges)
            hi = max(r.end for r in open_ranges)
            assert all(lo <= r.start and r.end <= hi for r in decoded)
        # when the full form fits it is exact, and says so; a degraded form says so too
        whole = encode_mirror_full(ranges, limit=limit)[1]
        if len(encode_mirror(ranges, limit=10**9)) <= limit and _maps_fit(open_ranges):
            assert whole and decoded == sorted(open_ranges, key=lambda r: r.start)
        if whole and all(a.end <= b.start for a, b in pairwise(sorted(open_ranges, key=lambda r: r.start))):
            assert decoded == sorted(open_ranges, key=lambda r: r.start)
        if not whole:
            assert decoded != sorted(open_ranges, key=lambda r: r.start)


class TestMarker:
    LINEAGE = "AbCdEfGhIjKlMnOpQrStUv/0123456789abcdef"
    RANGES = (RangeProgress(10, 100, 20), RangeProgress(200, 300, 250, frozenset({260})))

    def body(self) -> str:
        return encode_mirror(list(self.RANGES), limit=MARKED_MIRROR_LIMIT)

    def test_round_trip_names_the_lineage_and_the_offset(self) -> None:
        text = mark(self.body(), self.LINEAGE, 42)
        assert is_mirror(text) and text.startswith("fr2:")
        assert read_marker(text) == Marker(self.LINEAGE, 42, self.RANGES)

    def test_a_marker_without_ranges_still_names_its_lineage(self) -> None:
        assert read_marker(mark("", self.LINEAGE, 0)) == Marker(self.LINEAGE, 0, ())

    def test_an_older_mirror_has_no_lineage(self) -> None:
        assert read_marker(self.body()) == Marker(None, None, self.RANGES)

    @pytest.mark.parametrize("text", [None, "", "app-state-v1", "fr3:x", " fr2:x"])
    def test_foreign_metadata_is_no_marker(self, text: str | None) -> None:
        assert read_marker(text) is None

    @pytest.mark.parametrize(
        "header",
        [
            "fr2:AbC/0123456789abcdef/42",  # no ':' after the header
            "fr2:AbC/0123456789abcdef/:",  # no offset
            "fr2:AbC/0123456789abcdef/042:",  # a leading zero
            "fr2:AbC/0123456789abcdef/4²:",  # a digit that is not ASCII
            "fr2:AbC/0123456789abcdef/99999999999999999999:",  # beyond 2**63
            "fr2:AbC/0123456789ABCDEF/42:",  # upper-case nonce
            "fr2:AbC/0123/42:",  # short nonce
            "fr2:Ab.C/0123456789abcdef/42:",  # a character no cluster id has
            "fr2:0123456789abcdef/42:",  # no cluster part
        ],
    )
    def test_a_malformed_header_is_refused(self, header: str) -> None:
        with pytest.raises(CodecError):
            read_marker(header)

    def test_a_signed_marker_binds_its_header(self) -> None:
        key = b"k" * 32
        text = mark(self.body(), self.LINEAGE, 42, key=key, context="g/t/0")
        assert read_marker(text, key=key, context="g/t/0") == Marker(self.LINEAGE, 42, self.RANGES)
        moved = text.replace("/42:", "/7:")
        with pytest.raises(CodecError, match="not signed with the configured mirror key"):
            read_marker(moved, key=key, context="g/t/0")
        with pytest.raises(CodecError, match="not signed with the configured mirror key"):
            read_marker(text, key=key, context="g/t/1")
        with pytest.raises(CodecError, match="unsigned but a mirror key is configured"):
            read_marker(mark("", self.LINEAGE, 42), key=key, context="g/t/0")

    def test_the_worst_case_fits_the_brokers_limit(self) -> None:
        many = [
            RangeProgress(i * 1_000, i * 1_000 + 999, i * 1_000 + 1, frozenset({i * 1_000 + 7})) for i in range(500)
        ]
        widest = "W" * CLUSTER_MAX + "/" + "f" * 16
        text = mark(encode_mirror(many, limit=MARKED_MIRROR_LIMIT), widest, 2**63 - 2, key=b"k", context="g/t/0")
        assert len(text) <= MIRROR_LIMIT

    def test_lineages(self) -> None:
        lineage = new_lineage("MkU3OEVBNTcwNTJENDM2Qg", bytes(range(8)))
        assert lineage == "MkU3OEVBNTcwNTJENDM2Qg/0001020304050607"
        assert check_lineage(lineage) == lineage
        assert new_lineage(None, bytes(8)) == "/0000000000000000"
        odd = new_lineage("a cluster id/with:odd chars", bytes(8))
        assert check_lineage(odd) == odd, "an odd cluster id is replaced by its digest"
        with pytest.raises(ValueError, match="8 bytes"):
            new_lineage("c", b"short")


def test_short_payloads_are_stored_plain_and_need_no_zstandard() -> None:
    """A recovery's first mirror (a range or two, no map) is shorter than a zstd frame could pay for: it is
    written uncompressed, so the jump that writes it neither imports zstandard nor makes a compressor."""
    script = (
        "import sys\n"
        "from fastrecover.codec import decode_mirror, encode_mirror\n"
        "from fastrecover.completion_map import encode_completed\n"
        "from fastrecover.ranges import RangeProgress\n"
        "ranges = [RangeProgress(1000, 101000, 1000)]\n"
        "text = encode_mirror(ranges)\n"
        "assert decode_mirror(text) == ranges, text\n"
        "assert encode_completed(10, {12, 15})[1] in 'rb', 'a short map is not compressed'\n"
        "assert 'zstandard' not in sys.modules, 'imported for a short payload'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    long_map = encode_completed(0, set(range(2, 4000, 2)))
    assert long_map[1] in "RB", "a long repetitive map is still compressed"
