"""The host side of a step: scheduler, worker launch and the api's per-token output work,
each alone and end to end."""
