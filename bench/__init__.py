"""wsfleet benchmarks: `python -m bench` (see bench/RESULTS.md)."""
