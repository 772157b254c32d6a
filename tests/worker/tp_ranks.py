"""Test helpers for tensor parallelism on the CPU: ranks as spawned processes joined over
gloo (`spawn_ranks`, `leave`), and the check that each rank's shard of a model is its
slice of the whole model (`assert_rank_slices`)."""

from __future__ import annotations

import multiprocessing

import torch

from runtime.worker.models.causal_lm import CausalLM

RANKS = 2


def spawn_ranks(tmp_path, target, *args) -> None:
    """Run `target(rank, init, *args)` in RANKS spawned processes (`init`: a file store
    under `tmp_path` for `init_tp`); each must exit 0 (end with `leave`)."""
    init = f"file://{tmp_path / 'store'}"
    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=target, args=(r, init, *args)) for r in range(RANKS)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=300)
    assert [p.exitcode for p in ranks] == [0] * RANKS


def leave() -> None:
    """Leave the group together: a rank whose peer has already exited can abort in gloo's
    teardown."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """`t` comparable by `torch.equal` (fp8 viewed as its bytes)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def assert_rank_slices(whole: CausalLM, ranks: list[CausalLM]) -> None:
    """Every checkpoint tensor of `whole` (`--tp 1`) lands on rank r of `ranks` as its r-th
    slice along `tp_split_dim` (all of it where that is None)."""
    params = [dict(m.named_parameters()) for m in (whole, *ranks)]
    targets = [m.checkpoint_targets() for m in (whole, *ranks)]
    assert all(t.keys() == targets[0].keys() for t in targets)
    for hf_name, (name, start, rows) in targets[0].items():
        tensor = as_bits(params[0][name].narrow(0, start, rows))
        dim = whole.tp_split_dim(hf_name)
        for r in range(len(ranks)):
            name_r, start_r, rows_r = targets[r + 1][hf_name]
            want = tensor if dim is None else tensor.chunk(len(ranks), dim)[r]
            got = as_bits(params[r + 1][name_r].narrow(0, start_r, rows_r))
            assert torch.equal(got, want), hf_name
