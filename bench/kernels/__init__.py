"""Kernel benchmarks: each Triton kernel timed against torch and the measured copy ceiling,
and the sweeps that chose their tile tables."""
