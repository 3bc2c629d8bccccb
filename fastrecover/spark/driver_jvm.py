"""The driver's JVM, as :func:`~fastrecover.spark.start_kafka_stream` uses it before Spark starts.

Every ``jvm.org.apache...`` step is a round trip to the JVM, on the path from
``start_kafka_stream`` to the first fresh record: :func:`jvm_view` looks classes
up once, in a view of their own.  :func:`list_log_offsets` asks Kafka's Java
admin client for log starts and ends, with the query's ``kafka.*`` options as
Spark's own source would use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastrecover.errors import BrokerUnavailableError, ConfigError
from fastrecover.tokens import TopicPartitionKey


def jvm_view(spark: Any, *imports: str) -> Any:
    """A JVM view of its own with ``imports`` (``java_import`` names): every ``jvm.org.apache...`` step is a
    round trip to the JVM, and the recovery runs before Spark starts."""
    from py4j.java_gateway import java_import  # type: ignore[import-untyped]

    jvm = spark.sparkContext._gateway.new_jvm_view()
    for name in imports:
        java_import(jvm, name)
    return jvm


def list_log_offsets(
    spark: Any, client: Mapping[str, str], keys: list[TopicPartitionKey], timeout_s: float, *, earliest: bool
) -> dict[TopicPartitionKey, int]:
    """Log start (``earliest``) or log end of ``keys``, from Kafka's Java admin client in the driver's JVM.

    Java, not librdkafka: the query's ``kafka.*`` options are Java client properties (Spark's source takes
    them so, and SASL's ``sasl.jaas.config`` has no librdkafka equivalent), and under
    ``kafka.isolation.level=read_committed`` the log end is the last stable offset, as Spark's source sees
    it.  Only the admin client's own properties are passed (the consumer's would be logged as unknown).
    """
    if not keys:
        return {}
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    jvm = jvm_view(
        spark,
        "org.apache.kafka.clients.admin.*",
        "org.apache.kafka.common.*",
        "java.util.*",
        "java.util.concurrent.*",
        "java.time.*",
    )
    known = jvm.AdminClientConfig.configNames()
    props = jvm.Properties()
    read_committed = False
    for key, value in client.items():
        name = key[len("kafka.") :].lower()  # Kafka's property names are lower case; Spark's options are not
        if name == "isolation.level":
            read_committed = str(value).strip().lower() == "read_committed"
        elif known.contains(name):
            props.setProperty(name, str(value))
    levels = jvm.IsolationLevel
    options = jvm.ListOffsetsOptions(levels.READ_COMMITTED if read_committed else levels.READ_UNCOMMITTED)
    spec = jvm.OffsetSpec.earliest() if earliest else jvm.OffsetSpec.latest()
    partition = jvm.TopicPartition
    partitions = {k: partition(k.topic, k.partition) for k in keys}
    request = jvm.HashMap()
    for tp in partitions.values():
        request.put(tp, spec)
    try:
        admin = jvm.AdminClient.create(props)
    except Py4JJavaError as exc:
        raise ConfigError(f"cannot create a Kafka admin client from the kafka.* options: {exc.java_exception}") from exc
    try:
        answer = admin.listOffsets(request, options).all()
        result = answer.get(int(timeout_s * 1000), jvm.TimeUnit.MILLISECONDS)
        return {k: int(result.get(tp).offset()) for k, tp in partitions.items()}
    except Py4JJavaError as exc:
        what = f"log {'start' if earliest else 'end'} of {', '.join(f'{k.topic}[{k.partition}]' for k in keys)}"
        raise BrokerUnavailableError(f"cannot read the {what}: {exc.java_exception}") from exc
    finally:
        admin.close(jvm.Duration.ofSeconds(5))
