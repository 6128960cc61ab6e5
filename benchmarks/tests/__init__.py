"""Tests of the benchmarks package (``python -m benchmarks.<name>``): smoke runs, the harness, plugins."""
