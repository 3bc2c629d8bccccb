"""Keep passwords out of what ``fastrecover bench`` prints and writes (issue 11).

The bench writes its command line into results.json and docs/benchmarks.md,
both committed files, and errors from the stores into the JSON.  Two layers:
:func:`mask_url` / :func:`mask_command` hide the password part of any URL
(userinfo and password-like query parameters), and :func:`scrub` removes the
known secret values from any text as a last pass before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"

#: Query parameters that carry a secret in libpq, SQLAlchemy dialects and Kafka-style URLs.
_SECRET_KEYS = re.compile(r"(pass(word|wd|phrase)?|pwd|secret|token|api[_-]?key|credentials?)$", re.IGNORECASE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEYS.search(key.replace(".", "_")))


def url_secrets(url: str) -> list[str]:
    """The secret values inside ``url``: the userinfo password and password-like query values.

    Both the raw (percent-encoded) and the decoded form are returned, so either can be scrubbed.
    """
    if not _SCHEME.match(url):
        return []
    found: list[str] = []
    split = _split_userinfo(url)
    if split is not None and ":" in split[1]:
        raw = split[1].split(":", 1)[1]
        found += [raw, unquote(raw)]
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if _is_secret_key(key) and value:
            found += [value, quote(value, safe=""), quote(value)]
    return sorted({s for s in found if s}, key=len, reverse=True)


def mask_url(url: str) -> str:
    """``url`` with its password and password-like query values replaced by ``***``.

    Text that is not a URL comes back unchanged.  A password may contain ``@``,
    ``/`` or ``:`` (percent-encoded or not): the userinfo ends at the last ``@``.
    """
    if not _SCHEME.match(url):
        return url
    masked = url
    split = _split_userinfo(url)
    if split is not None and ":" in split[1]:
        head, userinfo, tail = split
        masked = f"{head}{userinfo.split(':', 1)[0]}:{MASK}@{tail}"
    parts = urlsplit(masked)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(_is_secret_key(k) for k, _ in pairs):
            query = urlencode([(k, MASK if _is_secret_key(k) else v) for k, v in pairs], safe="*")
            masked = urlunsplit(parts._replace(query=query))
    return masked


def _split_userinfo(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo, rest after '@')`` of a URL with userinfo, else None."""
    match = _SCHEME.match(url)
    if not match:
        return None
    rest = url[match.end() :]
    at = rest.rfind("@", 0, _authority_end(rest))
    if at < 0:
        return None
    return match.group(0), rest[:at], rest[at + 1 :]


def _authority_end(rest: str) -> int:
    """Index where the authority of ``rest`` (a URL without its scheme) ends.

    With an '@' present, the authority runs to the first '/', '?' or '#' *after
    the last '@'* that comes before the path, so a '/' inside a password does
    not end it early.
    """
    candidates = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
    limit = min(candidates) if candidates else len(rest)
    last_at = rest.rfind("@", 0, limit)
    slash = rest.find("/", last_at + 1 if last_at >= 0 else 0)
    ends = [i for i in (slash, limit) if i >= 0]
    return min(ends)


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
