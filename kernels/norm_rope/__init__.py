"""Per-token elementwise kernels: RMSNorm (with a fused residual add), rotary embedding,
and the gated activation."""
