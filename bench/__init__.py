"""Benchmarks of the shared frontier (see BENCHMARKS.md; ``python -m bench.run_all``)."""
