"""`python -m bench.peers`: see `bench.peers.driver`."""

from bench.peers.driver import main

main()
