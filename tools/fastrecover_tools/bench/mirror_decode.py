"""What the most expensive commit-metadata mirror costs recovery: CPU per partition to decode it.

Anyone who may commit offsets for a group writes the metadata recovery decodes, once per
partition.  The decoder's caps (rows, completed offsets, one byte budget for the body and
every completion map in it) bound that cost whatever the payload; this command builds the
payloads that come closest to the caps, and the one that once cost a second per partition,
and reports the CPU each takes to decode (median and spread of ``--repeats`` runs).

    python -m fastrecover_tools.bench.mirror_decode [--repeats 15]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import time
from collections.abc import Callable

import zstandard

from fastrecover.codec import MIRROR_MAX_COMPLETED, MIRROR_MAX_ROWS, decode_mirror
from fastrecover.completion_map import encode_completed
from fastrecover.errors import CodecError


def _mirror(rows: list[list[object]]) -> str:
    raw = json.dumps(rows, separators=(",", ":")).encode()
    return "fr1:Z" + base64.b64encode(zstandard.ZstdCompressor(level=19).compress(raw)).decode()


def _sparse_bitset(size: int) -> str:
    """A zstd bitset of ``size`` bytes with one bit set: the shape of the payload the byte budget refuses."""
    packed = zstandard.ZstdCompressor(level=19).compress(bytes(size - 1) + b"\x01")
    return "1B" + base64.b64encode(packed).decode()


def payloads() -> dict[str, str]:
    per_row = MIRROR_MAX_COMPLETED // MIRROR_MAX_ROWS
    span = 10**6
    return {
        "128 rows, each a 256 KiB bitset with one bit set": _mirror(
            [[i * 10**7, i * 10**7 + 5 * 10**6, i * 10**7, _sparse_bitset(256 * 1024)] for i in range(MIRROR_MAX_ROWS)]
        ),
        f"128 rows, {MIRROR_MAX_COMPLETED} dense completed offsets": _mirror(
            [
                [
                    i * span,
                    i * span + span // 10,
                    i * span,
                    encode_completed(i * span, range(i * span + 2, i * span + 2 + per_row)),
                ]
                for i in range(MIRROR_MAX_ROWS)
            ]
        ),
        f"128 rows, {MIRROR_MAX_COMPLETED} scattered completed offsets": _mirror(
            [
                [
                    i * span,
                    i * span + span // 10,
                    i * span,
                    encode_completed(i * span, range(i * span + 2, i * span + 2 + 2 * per_row, 2)),
                ]
                for i in range(MIRROR_MAX_ROWS)
            ]
        ),
        "128 rows, no completion maps": _mirror(
            [[i * span, i * span + span // 10, i * span, ""] for i in range(MIRROR_MAX_ROWS)]
        ),
    }


def measure(text: str, repeats: int, clock: Callable[[], float] = time.process_time) -> tuple[list[float], str]:
    """CPU seconds of each decode, and what the decoder made of the payload."""
    seconds: list[float] = []
    outcome = ""
    for _ in range(repeats):
        began = clock()
        try:
            outcome = f"{len(decode_mirror(text))} ranges"
        except CodecError as exc:
            outcome = f"refused: {exc}"
        seconds.append(clock() - began)
    return seconds, outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="decodes per payload (default 15)")
    args = parser.parse_args(argv)
    print(f"{'payload':58} {'chars':>6} {'median ms':>10} {'min-max ms':>14}  outcome")
    for name, text in payloads().items():
        seconds, outcome = measure(text, args.repeats)
        ms = [s * 1000 for s in seconds]
        print(f"{name:58} {len(text):6d} {statistics.median(ms):10.2f} {min(ms):6.2f}-{max(ms):<7.2f}  {outcome[:60]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
