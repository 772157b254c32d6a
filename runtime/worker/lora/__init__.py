"""Multi-LoRA serving on the worker: adapters read from PEFT folders (`adapter`), the
step's adapter segments (`batch`), the projections that apply them (`layer`), and the
device slots they load into (`manager`)."""
