"""Reasoning output: a model's `<think>...</think>` text split from its answer."""
