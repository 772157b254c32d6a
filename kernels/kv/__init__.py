"""Moving KV: stores into the pool (with fp8/int8 quantization, with RoPE fused), the page
table gather, and the host tier's slot copies."""
