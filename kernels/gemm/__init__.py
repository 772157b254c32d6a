"""Matrix products: the skinny decode GEMM and its measured config table, the block-scaled
fp8 GEMM, fp8 activation quantization, and the segmented LoRA shrink/expand GEMMs."""
