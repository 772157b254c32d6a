"""Sluice side by side with a peer engine (vLLM) on the same workloads, same GPU, one call.

`python -m bench.peers` runs each workload group on the peer and on Sluice, one after the
other, each in its own process, and writes one table of ratios (Sluice / peer);
`bench.peers.payload` builds the peer's packages for the GPU host without network and
`bench.peers.unpack` unpacks them there. docs/peers.md has the commands.
"""
