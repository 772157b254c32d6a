"""The production load test: mixed lengths, a soak at 80% of capacity, a burst (see
`bench.loadtest.driver`)."""
