"""`python -m bench.kernels`: see `bench.kernels.driver`."""

from bench.kernels.driver import main

main()
