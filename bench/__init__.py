"""Benchmarks for forklift (scripts, not tests)."""
