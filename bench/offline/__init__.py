"""Offline throughput and its parts: the in-process engine, the model step alone, KV dtypes,
fp8 weights, overlap, decode profiles."""
