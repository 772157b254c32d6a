"""`python -m bench.loadtest`: see `bench.loadtest.driver`."""

from bench.loadtest.driver import main

main()
