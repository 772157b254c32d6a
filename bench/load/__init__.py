"""Checkpoint loading: a random checkpoint of a preset's shape written as a Hub folder, the
disk's read speed, cold and warm loads with their host and GPU memory peaks, Engine
start-up to ready."""
