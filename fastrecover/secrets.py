"""The one place that decides what is a secret and hides it: URLs, configuration keys and values.

Store URLs, client configurations and command lines end up in messages, logs,
``repr()``, Spark's plans and committed benchmark files.  Each of those used to
carry its own masker, and they disagreed (one leaked the end of a password that
holds an ``@``, one did not treat ``ssl.key.pem`` as a secret).  Every call site
now asks this module, so a fix here reaches all of them.

Pure: it works on the text with :mod:`re` alone, never on a parse, so a URL that
a parser would reject or mis-read (an unescaped ``@``, ``/`` or ``:`` in the
password) still leaks nothing.  When the text is ambiguous it masks too much,
never too little.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MASK",
    "is_secret_key",
    "is_secret_param",
    "mask_config",
    "mask_url",
    "url_secrets",
]

#: What a secret is replaced with.
MASK = "***"

#: Substrings of configuration keys whose values are secrets (matched case-insensitively):
#: librdkafka's ``sasl.password``, ``ssl.key.password``, ``ssl.key.pem``, ``sasl.jaas.config``,
#: ``sasl.oauthbearer.client.secret``, Java clients' ``ssl.keystore.key``, our mirror key, ...
_SECRET_KEY_WORDS = (
    "password",
    "secret",
    "token",
    "credential",
    "jaas",
    "key.pem",
    "private.key",
    "keystore.key",
    "mirror.key",
)

#: Substrings of URL query parameter names whose values are secrets: libpq's ``password`` and
#: ``sslpassword``, SQLAlchemy dialects' ``passwd``/``pwd``, OAuth-style ``token``/``client_secret``.
_SECRET_PARAM_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "credential",
    "apikey",
    "api_key",
    "api-key",
)

#: One ``name=value`` of a query string (``?``, ``&`` or ``;`` before it) whose name holds a secret word or
#: ends with ``pass`` (``pass=``, ``db_pass=``; only at the end, so that ``passive=`` stays readable).
_SECRET_PARAM = (
    r"[?&;](?P<name>[^=&;#]*(?:(?:"
    + "|".join(map(re.escape, _SECRET_PARAM_WORDS))
    + r")[^=&;#]*|pass))=(?P<value>[^&;#]*)"
)
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
#: SQLAlchemy renders a URL it mis-parsed (an unescaped ``@`` in the password) with that ``@`` as ``%40``.
_ESCAPED_AT = "%40"


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The secret-parameter and scheme patterns, compiled at the first mask.

    Compiled at import they cost about 0.8 ms of every mode-on consumer's start (``config`` imports
    this module), on the way to its first record, for masks that only errors and reprs need.
    """
    return re.compile(_SECRET_PARAM, re.IGNORECASE), re.compile(_SCHEME)


def is_secret_key(key: str) -> bool:
    """Whether a configuration key's value is a secret, never to be printed, logged or repr'd."""
    lowered = key.lower()
    return any(word in lowered for word in _SECRET_KEY_WORDS)


def is_secret_param(name: str) -> bool:
    """Whether a URL query parameter's value is a secret (``password``, ``sslpassword``, ``auth_token``...)."""
    return _patterns()[0].fullmatch(f"?{name}=") is not None


def _query_spans(text: str, start: int) -> list[tuple[int, int]]:
    """Spans of the secret query values in ``text[start:]``; a value may be empty (``password=``)."""
    return [m.span("value") for m in _patterns()[0].finditer(text, start)]


def _secret_spans(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that hold secrets, sorted and merged.

    With a scheme, the user-info ends at the *last* ``@`` (a password may hold
    ``@``, ``/``, ``:`` or ``?``; a host cannot hold ``@``), and everything after
    its first ``:`` is the password.  A URL SQLAlchemy mis-parsed renders the
    password's real end as ``%40``, so an escaped ``@`` after the last ``@``
    ends the user-info instead.  Without a scheme, anything after a ``:`` may be
    a password (``user:secret@host`` or a bare ``user:secret``), so all of it is
    hidden.  In both cases the values of secret query parameters are secrets too.
    """
    spans: list[tuple[int, int]] = []
    scheme = _patterns()[1].match(text)
    if scheme is None:
        # "?" + text so that a leading "password=..." counts as a parameter; spans shift back by one.
        spans += [(a - 1, b - 1) for a, b in _query_spans("?" + text, 0)]
        colon = text.find(":")
        if colon >= 0:
            spans.append((colon + 1, len(text)))
    else:
        begin = scheme.end()
        at = text.rfind("@", begin)
        escaped = text.upper().rfind(_ESCAPED_AT, begin)
        end = escaped if escaped > at else at
        colon = text.find(":", begin, end) if end >= 0 else -1
        if colon >= 0:
            # the parameters are searched after the user-info only: a '?' inside the password starts none
            spans.append((colon + 1, end))
            spans += _query_spans(text, end)
        else:
            spans += _query_spans(text, begin)
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def mask_url(url: str) -> str:
    """``url`` with its password and every secret query value replaced by :data:`MASK`.

    Safe for messages, logs, ``repr()`` and files.  Text without a scheme is
    treated as a URL gone wrong (``user:secret@host``): everything after its
    first ``:`` is hidden.  The host, port and database stay readable, so the
    message still says which store it is about.
    """
    out: list[str] = []
    last = 0
    for a, b in _secret_spans(url):
        out += [url[last:a], MASK]
        last = b
    out.append(url[last:])
    return "".join(out)


def url_secrets(url: str) -> list[str]:
    """The secret substrings of ``url`` exactly as written (percent-encoded or not), longest first.

    For redacting a text that may quote the URL's secrets outside the URL (a
    driver's error message): the caller removes each of them.  Empty values are
    left out, since they hide nothing.
    """
    found = {url[a:b] for a, b in _secret_spans(url) if b > a}
    return sorted(found, key=lambda s: (-len(s), s))


def mask_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` for logs and ``repr()``: secret keys' values become :data:`MASK`, URLs are masked.

    A value is treated as a URL when it is text holding ``://``: an OAuth token
    endpoint or a store URL may carry a password in its user-info or query.
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if is_secret_key(str(key)):
            out[key] = MASK
        elif isinstance(value, str) and "://" in value:
            out[key] = mask_url(value)
        else:
            out[key] = value
    return out
