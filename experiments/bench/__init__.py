"""Benchmarks that print ratios measured in one run (see common.py for the shared utilities).

    python -m experiments.bench.model_step          # train-step MFU, cached vs recompute decoding
    python -m experiments.bench.model_step --quick  # smoke version, a minute or so
"""
