"""The ``kafka.*`` options of the Spark sources: the client configuration, refused keys, secrets.

A query's options are often assembled from less trusted configuration and end
up in Spark's UI, logs and plans.  So the keys that would make the Kafka client
load code or run a command are refused, the keys the source owns (it never
joins a group nor commits) are refused with the reason, and every secret
(client passwords, JAAS configs, the store URL's password) is masked wherever
the options are shown.  Pure: no client is created here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from fastrecover import secrets
from fastrecover.errors import ConfigError
from fastrecover.secrets import is_secret_key as is_secret_key

__all__ = [
    "DANGEROUS_KAFKA_KEYS",
    "OWNED_KAFKA_KEYS",
    "MaskedRepr",
    "is_secret_key",
    "kafka_conf",
    "mask_secrets_in_url",
    "masked_kafka",
]

#: Client properties that load code or run commands: a query's options are often assembled from less
#: trusted configuration, so these are refused rather than handed to the client.
DANGEROUS_KAFKA_KEYS = frozenset(
    {
        "plugin.library.paths",
        "sasl.kerberos.kinit.cmd",
        "ssl.engine.location",
        "ssl_engine_location",
        "oauthbearer_token_refresh_cb",
        "oc_cb",
        "interceptor.classes",
        "sasl.login.class",
        "sasl.login.callback.handler.class",
        "sasl.client.callback.handler.class",
        "sasl.oauthbearer.jwks.endpoint.url",
        "ssl.engine.factory.class",
        "metric.reporters",
        "config.providers",
        "key.deserializer",
        "value.deserializer",
    }
)
#: Keys the source sets itself: it never joins a group nor commits (Spark's checkpoint keeps the offsets),
#: and it must see a missing offset as an error (data loss), never silently reset.
OWNED_KAFKA_KEYS = frozenset(
    {"group.id", "enable.auto.commit", "auto.offset.reset", "enable.auto.offset.store", "enable.partition.eof"}
)


def kafka_conf(options: Mapping[str, str]) -> dict[str, str]:
    """The Kafka client configuration of the ``kafka.*`` options; ConfigError for a refused key."""
    conf = {k[len("kafka.") :]: str(v) for k, v in options.items() if k.lower().startswith("kafka.")}
    if not conf.get("bootstrap.servers"):
        raise ConfigError("option kafka.bootstrap.servers is required")
    for key in sorted(conf):
        if key.lower() in DANGEROUS_KAFKA_KEYS or key.lower().endswith((".cmd", ".class", ".classes")):
            raise ConfigError(
                f"option kafka.{key} is refused: it makes the Kafka client load a library or run a command"
            )
        if key.lower() in OWNED_KAFKA_KEYS:
            raise ConfigError(
                f"option kafka.{key} is not supported: the source never joins a group nor commits to Kafka "
                "(Spark's checkpoint keeps the offsets) and treats a missing offset as data loss "
                "(see failOnDataLoss)"
            )
    return conf


def mask_secrets_in_url(url: str) -> str:
    """``url`` with its password (user info and query string) replaced by ``***``: the shared masker's."""
    return secrets.mask_url(url)


def masked_kafka(conf: Mapping[str, str]) -> dict[str, str]:
    """The Kafka configuration with secret values replaced by ``***`` (and URL values masked)."""
    return secrets.mask_config(conf)


class MaskedRepr:
    """Base of the options dataclasses: a repr that never shows a secret (Kafka passwords, JAAS configs,
    the store URL's password), since options end up in logs and Spark's plans."""

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):  # type: ignore[arg-type]
            value: Any = getattr(self, f.name)
            if f.name == "kafka":
                value = masked_kafka(value)
            elif f.name == "store_url":
                value = mask_secrets_in_url(value)
            parts.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    __str__ = __repr__
