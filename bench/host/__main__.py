"""`python -m bench.host`: see `bench.host.driver`."""

from bench.host.driver import main

main()
