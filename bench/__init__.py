"""hostedrooms benchmarks (not shipped): ``python bench/run.py --help``."""
