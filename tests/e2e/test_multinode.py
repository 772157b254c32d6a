"""Tensor parallelism across hosts: two "nodes" on localhost (`--tp 2 --nnodes 2`, one
rank each, gloo over TCP at `--dist-init-addr`) give the greedy tokens of one worker."""

from __future__ import annotations

import threading

import torch

from runtime import Engine, SamplingParams
from runtime.client import Client
from tests.e2e.server import ServerProcess, free_port_range

MAX_TOKENS = 8


def test_two_nodes_equal_one_worker(tmp_path):
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 1024, (n,), generator=gen).tolist() for n in (7, 33, 90)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    with Engine(model="dummy:tiny", torch_threads=1) as eng:
        whole = [o.token_ids for o in eng.generate(prompts, params)]

    dist = free_port_range(4)  # torch.distributed, then the scheduler's channels
    args = ["--model", "dummy:tiny", "--tp", "2", "--nnodes", "2", "--torch-threads", "1",
            "--dist-init-addr", f"127.0.0.1:{dist}"]
    nodes: dict[int, ServerProcess] = {}

    def start(rank: int, ready_text: str) -> None:
        nodes[rank] = ServerProcess(*args, "--node-rank", str(rank), tmpdir=str(tmp_path),
                                    ready_text=ready_text)

    # node 1 reports ready only once node 0's rank has joined the group
    joiner = threading.Thread(target=start, args=(1, "node 1 of 2: TP ranks 1..1"))
    joiner.start()
    try:
        start(0, "serving ")
        joiner.join(240)
        assert 1 in nodes, "node 1 did not start"
        with Client(nodes[0].rpc_addr, timeout=60) as client:
            split = [client.generate(p, max_tokens=MAX_TOKENS, temperature=0.0,
                                     ignore_eos=True).token_ids for p in prompts]
        assert split == whole
        assert set(nodes[1].pids) == {"worker1"}  # the api and scheduler run on node 0 only
    finally:
        joiner.join(240)
        for node in nodes.values():
            node.stop()
    assert all(node.wait(30) == 0 for node in nodes.values())
