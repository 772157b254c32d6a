"""`python -m bench.serving`: see `bench.serving.driver`."""

from bench.serving.driver import main

main()
