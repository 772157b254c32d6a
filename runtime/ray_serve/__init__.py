"""Sluice on Ray Serve: one server per replica, replicas scaled by an autoscaling policy
that reads the servers' own load, prefix-aware routing, drained scale-in.

Needs the optional dependency `ray[serve]` (`pip install 'sluice[ray]'`); run it as
`python -m runtime.ray_serve` (docs/ray-serve.md).
"""
