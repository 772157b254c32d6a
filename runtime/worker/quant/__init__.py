"""Weight quantization of the worker's linear layers (`--quantization`)."""
