"""The local broker's readiness probe tells a settling broker from a broken one."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from fastrecover_tools.testing.broker import probe_error_is_transient


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
    ],
)
def test_a_dropped_connection_or_a_settling_controller_is_tried_again(code: int) -> None:
    assert probe_error_is_transient(KafkaError(code))


def test_an_error_kafka_flags_retriable_is_tried_again() -> None:
    assert probe_error_is_transient(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, retriable=True))


@pytest.mark.parametrize(
    "code",
    [KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_CONFIG],
)
def test_a_refusal_is_not_retried(code: int) -> None:
    assert not probe_error_is_transient(KafkaError(code))
