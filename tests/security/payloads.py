"""The hostile commit-metadata payloads of issue 11, shared by the decoder and real-consumer tests.

Each is a commit-metadata string as an attacker who may commit offsets for the
group would write it, built from the wire format (not from encode_mirror, which
would refuse to produce most of them).
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache

import zstandard


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def mirror(rows: object, *, compress: bool = True) -> str:
    raw = json.dumps(rows, separators=(",", ":")).encode()
    if compress:
        return "fr1:Z" + base64.b64encode(zstandard.ZstdCompressor(level=19).compress(raw)).decode()
    return "fr1:J" + base64.b64encode(raw).decode()


def run_map(gap: int, length: int) -> str:
    """A run-length completion map: ``length`` done offsets ``gap`` above committed + 1."""
    return "1r" + base64.b64encode(_varint(gap) + _varint(length)).decode()


def bitset_map(nbytes: int) -> str:
    """A zstd bitset of ``nbytes`` 0xFF bytes: 8 * nbytes done offsets in a few dozen characters."""
    return "1B" + base64.b64encode(zstandard.ZstdCompressor(level=19).compress(b"\xff" * nbytes)).decode()


@lru_cache(maxsize=8)
def payloads(log_end: int) -> dict[str, str]:
    """Every payload of the issue, for a partition whose log ends at ``log_end``.

    The ones that are well-formed on the wire point into ``[0, log_end)``, so a
    consumer that trusted them would skip records there.
    """
    big = 2**62
    return {
        "run map of 5M offsets": mirror([[0, big, 0, run_map(0, 5_000_000)]]),
        "bitset map of 4.8M offsets": mirror([[0, big, 0, bitset_map(600_000)]]),
        "bitset map within the size cap": mirror([[0, big, 0, bitset_map(200_000)]]),
        "range of length 2^63": mirror([[0, 2**63, 0, ""]]),
        "offsets above BIGINT": mirror([[2**63 + 5, 2**63 + 10, 2**63 + 5, ""]]),
        "negative offsets": mirror([[-5, log_end, -5, ""]]),
        "5,000 identical rows": mirror([[0, log_end, 0, ""]] * 5_000),
        "2M identical rows": mirror([[0, 10, 0, ""]] * 2_000_000),
        "100 identical rows": mirror([[0, log_end, 0, ""]] * 100),
        "committed = end - 1": mirror([[0, log_end, log_end - 1, ""]]),
        "completed all but the first": mirror([[0, log_end, 0, run_map(0, log_end - 2)]]),
        "range past the log end": mirror([[0, log_end + 10**12, 0, ""]]),
        "overlapping ranges": mirror(
            [[0, log_end // 2, log_end // 2 - 1, ""], [log_end // 4, log_end, log_end - 1, ""]]
        ),
        "deep json": "fr1:Z" + base64.b64encode(zstandard.ZstdCompressor().compress(b"[" * 50_000)).decode(),
        "zstd bomb": "fr1:Z"
        + base64.b64encode(zstandard.ZstdCompressor(level=19).compress(b" " * 50_000_000)).decode(),
        "not base64": "fr1:J!!!!",
        "garbage": "fr1:Zabcd",
    }
