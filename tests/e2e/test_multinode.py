"""Tensor parallelism across hosts: two "nodes" on localhost (`--tp 2 --nnodes 2`, one
rank each, over TCP at `--dist-init-addr`) give the greedy tokens of one worker: gloo on
the CPU, NCCL on two GPUs (each node sees one of them, as on two hosts)."""

from __future__ import annotations

import threading

import pytest
import torch

from runtime import Engine, SamplingParams
from runtime.client import Client
from tests.e2e.server import ServerProcess, free_port_range
from tests.near_tie import near_tie_failures_by_logprobs

MAX_TOKENS = 8


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, 1024, (n,), generator=gen).tolist() for n in (7, 33, 90)]


def _two_nodes(tmp_path, prompts: list[list[int]], *options: str,
               envs: tuple[dict, dict] = ({}, {})) -> list[list[int]]:
    """Greedy tokens of `prompts` from a TP group of two nodes; both nodes exit 0 after."""
    dist = free_port_range(4)  # torch.distributed, then the scheduler's channels
    args = ["--model", "dummy:tiny", "--tp", "2", "--nnodes", "2", "--torch-threads", "1",
            "--dist-init-addr", f"127.0.0.1:{dist}", *options]
    nodes: dict[int, ServerProcess] = {}

    def start(rank: int, ready_text: str) -> None:
        nodes[rank] = ServerProcess(*args, "--node-rank", str(rank), tmpdir=str(tmp_path),
                                    ready_text=ready_text, env=envs[rank])

    # node 1 reports ready only once node 0's rank has joined the group
    joiner = threading.Thread(target=start, args=(1, "node 1 of 2: TP ranks 1..1"))
    joiner.start()
    try:
        start(0, "serving ")
        joiner.join(240)
        assert 1 in nodes, "node 1 did not start"
        assert set(nodes[1].pids) == {"worker1"}  # the api and scheduler run on node 0 only
        with Client(nodes[0].rpc_addr, timeout=60) as client:
            return [client.generate(p, max_tokens=MAX_TOKENS, temperature=0.0,
                                    ignore_eos=True).token_ids for p in prompts]
    finally:
        joiner.join(240)
        for node in nodes.values():
            node.stop()
        assert all(node.wait(30) == 0 for node in nodes.values())


def test_two_cpu_nodes_equal_one_worker(tmp_path):
    prompts = _prompts()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    with Engine(model="dummy:tiny", torch_threads=1) as eng:
        whole = [o.token_ids for o in eng.generate(prompts, params)]
    assert _two_nodes(tmp_path, prompts, "--device", "cpu") == whole


@pytest.mark.gpu
def test_two_gpu_nodes_equal_one_gpu(tmp_path):
    """NCCL between two processes that each see one GPU; fp32 (the split matmuls sum in
    another order: only a near-tie may flip, as in test_tp)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    prompts = _prompts()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                            top_logprobs=2)
    with Engine(model="dummy:tiny", device="cuda", dtype="float32") as eng:
        whole = eng.generate(prompts, params)
    split = _two_nodes(tmp_path, prompts, "--device", "cuda", "--dtype", "float32",
                       envs=({"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}))
    assert near_tie_failures_by_logprobs(split, whole) == []
