"""`python -m bench.load`: see `bench.load.driver`."""

from bench.load.driver import main

main()
