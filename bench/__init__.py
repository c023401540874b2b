"""Benchmarks: scripts that print figures (medians, ratios); never timed tests."""
