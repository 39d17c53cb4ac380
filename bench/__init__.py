"""The benchmarks: measurements too slow for the suite (``python -m bench``; docs/benchmarks.md)."""
