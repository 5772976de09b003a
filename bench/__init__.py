"""Ferry's benchmarks: each module runnable as ``python -m bench.<name>``."""
