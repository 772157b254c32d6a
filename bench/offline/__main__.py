"""`python -m bench.offline`: see `bench.offline.driver`."""

from bench.offline.driver import main

main()
