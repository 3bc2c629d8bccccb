"""Tools around fastrecover, shipped apart from the runtime library.

``bench`` (benchmarks against the plain consumer), ``chaos`` (SIGKILL fault
campaign), ``demo`` (the KIP's crash/restart story), ``testing`` (a real Kafka
broker for tests and the demo, worker processes, deadlines) and ``spark_bench``.
The ``fastrecover demo|bench|chaos`` commands import this package lazily.
"""
