"""Attention kernels over the KV pool: decode (split-KV, 16-bit, quantized, Gluon), extend
(prefill over a cached prefix), MLA, their launch configs and torch references."""
