"""Matrix products: the skinny decode GEMM and its measured config table, the block-scaled
fp8 GEMM, and fp8 activation quantization."""
