"""Runnable examples of sparkdl (also used by the benchmarks and tests)."""
