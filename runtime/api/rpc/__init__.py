"""The native streaming RPC front over ZeroMQ: the server (`server`), its per-turn replies
(`outbox`) and its connection count (`peers`)."""
