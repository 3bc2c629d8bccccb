"""The one masker (fastrecover.secrets) and every call site that uses it: no password survives.

The properties compare the masked text with the *exact* text expected (the URL
with ``***`` where the password was).  That is the sound form of "the password
never shows": every character of the output is accounted for by the visible
parts (scheme, user, host, port, database), so no piece of the password can
remain, whatever it holds.  A substring test ("the password is not in the
output") would be unsound both ways: a password such as ``postgres`` or ``***``
is a piece of the visible text, and a leaked tail of a password is not the
password.  The host and database staying visible is part of the same equality.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from fastrecover import config, secrets
from fastrecover.spark import client_conf
from fastrecover.store import engine
from fastrecover_tools.bench import redact

#: Characters that make a password hard to find in a URL, plus letters from outside ASCII.
HOSTILE = "@:/%?#&;=+ !*'\"\\[]"
passwords = st.text(
    alphabet=st.one_of(
        st.sampled_from(HOSTILE),
        st.characters(min_codepoint=0x30, max_codepoint=0x7A),  # digits, letters and some punctuation
        st.characters(min_codepoint=0xA1, max_codepoint=0xD7FF),  # é, ß, Ж, 中... (below the surrogates)
    ),
    min_size=1,
    max_size=24,
)
#: The visible parts of a URL: names a user, host and database really have (no '@', ':', '/', '%').
users = st.from_regex(r"[a-z][a-z0-9_.-]{0,11}", fullmatch=True)
hosts = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,8}){0,2}", fullmatch=True)
databases = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
schemes = st.sampled_from(["postgresql", "postgresql+psycopg", "mysql+pymysql", "sqlite"])
ports = st.integers(1, 65535)

#: Every masker the code base has, as its callers reach it; each must give the same answer.
URL_MASKERS = {
    "secrets.mask_url": secrets.mask_url,
    "store.engine.mask_url": engine.mask_url,
    "spark.client_conf.mask_secrets_in_url": client_conf.mask_secrets_in_url,
    "bench.redact.mask_url": redact.mask_url,
}

slow_machine = settings(deadline=None)  # a busy 2-core machine: no per-example time limit


@slow_machine
@given(scheme=schemes, user=users, password=passwords, host=hosts, port=ports, db=databases)
def test_the_userinfo_password_is_replaced_whole(
    scheme: str, user: str, password: str, host: str, port: int, db: str
) -> None:
    """Raw or percent-encoded, a password with '@', ':', '/', '%' or non-ASCII is hidden whole, by every masker."""
    expected = f"{scheme}://{user}:***@{host}:{port}/{db}"
    for written in (password, quote(password, safe="")):
        url = f"{scheme}://{user}:{written}@{host}:{port}/{db}"
        for name, mask in URL_MASKERS.items():
            assert mask(url) == expected, name
        assert secrets.url_secrets(url) == [written]
        assert engine.has_secret(url)


@slow_machine
@given(user=users, password=passwords, host=hosts, db=databases, key=st.sampled_from(["password", "sslpassword"]))
def test_a_query_password_is_replaced_whole(user: str, password: str, host: str, db: str, key: str) -> None:
    """A secret query parameter (percent-encoded, as a query value must be) keeps its name, loses its value."""
    url = f"postgresql://{user}@{host}/{db}?sslmode=require&{key}={quote(password, safe='')}&application_name=x"
    expected = f"postgresql://{user}@{host}/{db}?sslmode=require&{key}=***&application_name=x"
    for name, mask in URL_MASKERS.items():
        assert mask(url) == expected, name


@slow_machine
@given(user=users, password=passwords, host=hosts, db=databases)
def test_a_parsed_url_is_masked_like_its_text(user: str, password: str, host: str, db: str) -> None:
    """The store also takes SQLAlchemy URL objects: rendered with their password, then masked the same way."""
    url = make_url(f"postgresql+psycopg://{user}:{quote(password, safe='')}@{host}:5432/{db}")
    assert engine.mask_url(url) == f"postgresql+psycopg://{user}:***@{host}:5432/{db}"


@slow_machine
@given(user=users, password=passwords, host=hosts, db=databases)
def test_text_without_a_scheme_hides_everything_after_the_first_colon(
    user: str, password: str, host: str, db: str
) -> None:
    """A URL whose scheme got lost (a config typo) may still hold a password: only the user stays."""
    assert secrets.mask_url(f"{user}:{password}@{host}/{db}") == f"{user}:***"


@slow_machine
@given(password=passwords, user=users, host=hosts, db=databases)
def test_configurations_hide_secret_keys_and_mask_url_values(password: str, user: str, host: str, db: str) -> None:
    """The consumer's child overrides and the Spark kafka.* options: one rule for keys, one for URL values."""
    conf = {
        "bootstrap.servers": f"{host}:9092",
        "sasl.password": password,
        "ssl.key.pem": password,
        "ssl.key.password": password,
        "sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule password="{password}";',
        "sasl.oauthbearer.client.secret": password,
        "fastrecover.store.url": f"postgresql://{user}:{quote(password, safe='')}@{host}/{db}",
    }
    expected = {
        "bootstrap.servers": f"{host}:9092",
        "sasl.password": "***",
        "ssl.key.pem": "***",
        "ssl.key.password": "***",
        "sasl.jaas.config": "***",
        "sasl.oauthbearer.client.secret": "***",
        "fastrecover.store.url": f"postgresql://{user}:***@{host}/{db}",
    }
    assert config.mask_config(conf) == expected
    assert client_conf.masked_kafka(conf) == expected


@pytest.mark.parametrize(
    "key",
    ["ssl.key.pem", "SSL.KEY.PEM", "sasl.password", "ssl.keystore.key", "ssl.key.password", "sasl.jaas.config"],
)
def test_secret_keys_are_the_same_everywhere(key: str) -> None:
    """ssl.key.pem was a secret for the consumer but not for the Spark options: one list now."""
    assert secrets.is_secret_key(key)
    assert config.is_secret_key(key)
    assert client_conf.is_secret_key(key)


@pytest.mark.parametrize("key", ["bootstrap.servers", "ssl.certificate.pem", "ssl.ca.location", "group.id"])
def test_ordinary_keys_stay_visible(key: str) -> None:
    assert not secrets.is_secret_key(key)
    assert secrets.mask_config({key: "value"}) == {key: "value"}


def test_spark_no_longer_leaks_the_end_of_a_password_holding_an_at() -> None:
    """The old Spark masker stopped at the first '@' and showed ``u:***@ss@host``."""
    assert client_conf.mask_secrets_in_url("postgresql://u:p@ss@host/db") == "postgresql://u:***@host/db"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://h/db?password=abc&x=%40", "postgresql://h/db?password=***&x=%40"),
        ("postgresql://u@h/db?password=", "postgresql://u@h/db?password=***"),
        ("postgresql://u@h/db?PassWord=a;x=1", "postgresql://u@h/db?PassWord=***;x=1"),
        # SQLAlchemy's rendering of a URL it mis-parsed: the password's real end is the escaped '@'
        ("postgresql://app:p@ss%40db.example/ranges", "postgresql://app:***%40db.example/ranges"),
        # ambiguous: an '@' after the query may end the user-info, so all before it is hidden
        ("postgresql://u:pw@h/db?x=a@b", "postgresql://u:***@b"),
        ("no-scheme?password=hunter9", "no-scheme?password=***"),
        ("mysql://u@h/db?pass=a&db_pass=b&passive=1", "mysql://u@h/db?pass=***&db_pass=***&passive=1"),
    ],
)
def test_examples(url: str, masked: str) -> None:
    assert secrets.mask_url(url) == masked


def test_url_secrets_are_what_mask_url_hides() -> None:
    url = "postgresql://u:p%40ss@h/db?sslpassword=k3y&password="
    assert secrets.url_secrets(url) == ["p%40ss", "k3y"]  # the empty value hides nothing
    assert {"p%40ss", "p@ss", "k3y"} <= set(redact.url_secrets(url))
