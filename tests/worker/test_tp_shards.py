"""Each TP rank's weights are its Megatron-style slice of the whole model's (no process
group needed: the shards are built and loaded rank by rank in this process)."""

from __future__ import annotations

import torch

from runtime.model_config import resolve_model
from runtime.worker.loader import load_model
from runtime.worker.tp import TPGroup

TP = 2


def test_dummy_shards_are_slices_of_the_whole_model():
    spec = resolve_model("dummy:tiny")  # 8 heads, 2 KV heads, head_dim 32, inter 512
    whole = dict(load_model(spec, "cpu", torch.float32, seed=1).named_parameters())
    shards = [dict(load_model(spec, "cpu", torch.float32, seed=1, tp=TPGroup(r, TP))
                   .named_parameters()) for r in range(TP)]
    q, kv, inter = 8 * 32, 2 * 32, 512

    def rows(t, *spans):  # rank r's rows of each (start, size) piece, concatenated
        return [torch.cat([t[s + r * n // TP: s + (r + 1) * n // TP] for s, n in spans])
                for r in range(TP)]

    qkv = "model.layers.1.self_attn.qkv_proj.weight"
    gate_up = "model.layers.0.mlp.gate_up_proj.weight"
    expect = {
        qkv: rows(whole[qkv], (0, q), (q, kv), (q + kv, kv)),
        gate_up: rows(whole[gate_up], (0, inter), (inter, inter)),
        "model.embed_tokens.weight": rows(whole["model.embed_tokens.weight"], (0, 1024)),
        "lm_head.weight": rows(whole["lm_head.weight"], (0, 1024)),
    }
    for name in ("model.layers.1.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        expect[name] = list(whole[name].chunk(TP, dim=1))  # row-parallel: input columns
    expect["model.norm.weight"] = [whole["model.norm.weight"]] * TP  # replicated
    for name, parts in expect.items():
        for r in range(TP):
            assert torch.equal(shards[r][name], parts[r]), (name, r)
    assert shards[0][qkv].shape == (q // TP + 2 * kv // TP, 256)
