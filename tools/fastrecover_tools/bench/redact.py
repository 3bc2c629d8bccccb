"""Keep passwords out of what ``fastrecover bench`` prints and writes (issue 11).

The bench writes its command line into results.json and docs/benchmarks.md,
both committed files, and errors from the stores into the JSON.  Two layers:
:func:`mask_url` / :func:`mask_command` hide the password part of any URL
(userinfo and password-like query parameters) with the library's masker
(:mod:`fastrecover.secrets`), and :func:`scrub` removes the known secret values
from any text as a last pass before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote, unquote_plus

from fastrecover import secrets

#: What a secret is replaced with (the library's).
MASK = secrets.MASK
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def url_secrets(url: str) -> list[str]:
    """The secret values inside ``url``: the userinfo password and password-like query values.

    Which parts are secrets is the library's decision (:func:`fastrecover.secrets.url_secrets`);
    this adds their other spellings, raw (percent-encoded) and decoded, so a driver's message
    that quotes either form is scrubbed too.
    """
    if not _SCHEME.match(url):
        return []
    found: set[str] = set()
    for raw in secrets.url_secrets(url):
        decoded = unquote_plus(raw)
        found |= {raw, unquote(raw), decoded, quote(decoded, safe=""), quote(decoded)}
    return sorted((s for s in found if s), key=len, reverse=True)


def mask_url(url: str) -> str:
    """``url`` with its password and password-like query values replaced by ``***``.

    Text that is not a URL comes back unchanged (a command line's other words pass
    through :func:`mask_command`).  A password may contain ``@``, ``/`` or ``:``
    (percent-encoded or not): the library's masker ends the userinfo at the last ``@``.
    """
    if not _SCHEME.match(url):
        return url
    return secrets.mask_url(url)


def mask_command(words: Sequence[str]) -> list[str]:
    """A command line with every URL argument masked (``--pg-url URL`` and ``--pg-url=URL`` alike)."""
    out = []
    for word in words:
        if "=" in word and word.startswith("--"):
            flag, value = word.split("=", 1)
            out.append(f"{flag}={mask_url(value)}")
        else:
            out.append(mask_url(word))
    return out


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``.

    One pass over the text, longest secret first at each position, so a mask
    already written is never matched again (a password such as ``r:**`` would
    otherwise eat into the ``user:***`` written for the encoded form).
    """
    ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not ordered:
        return text
    return re.sub("|".join(re.escape(s) for s in ordered), MASK, text)
