"""Weight quantization of the worker's linear layers: `--quantization fp8` and fp8 checkpoints."""
