"""Signatures of the commit-metadata mirror, and digests of unusual cluster ids.

Importing ``hashlib`` loads OpenSSL: 2-3 ms of CPU that a restarted consumer's first record would
wait for (the mode's import runs during the group join, :mod:`fastrecover.startup`), while only a
consumer with ``fastrecover.commit.mirror.key`` set, or a cluster id of characters a lineage cannot
hold, needs it.  So :mod:`fastrecover.codec` imports this module at its first use, not with the mode.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

#: bytes of the HMAC-SHA256 kept in a signed mirror (base64: 24 characters with padding)
MAC_BYTES = 16


def mac(key: bytes, context: str, body: str) -> str:
    """The signature of ``body`` for ``context`` (the group and partition it was committed for)."""
    digest = hmac.new(key, context.encode("utf-8") + b"\0" + body.encode("ascii"), hashlib.sha256).digest()
    return base64.b64encode(digest[:MAC_BYTES]).decode("ascii")


def matches(signature: str, key: bytes, context: str, body: str) -> bool:
    """Whether ``signature`` is ``body``'s for ``context``, compared in constant time."""
    return hmac.compare_digest(signature, mac(key, context, body))


def digest(text: str) -> str:
    """32 hex digits of SHA-256: a short, fixed-alphabet stand-in for ``text``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
