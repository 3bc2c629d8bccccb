"""Test infrastructure shared by the test suite, the demo and the benchmarks (real brokers, waiting)."""
