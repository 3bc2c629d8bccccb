"""Benchmarks: what fast recovery buys, measured against the plain confluent_kafka.Consumer.

Run with ``fastrecover bench`` (or ``make bench``); see docs/benchmarks.md.
Benchmarks are a separate command, never timed assertions in tests.
"""
