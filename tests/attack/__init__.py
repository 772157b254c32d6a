"""The attack battery (`python -m tests.attack`): malformed and hostile input, floods and
signals against a server on loopback, with tried / failed / lost per group."""
