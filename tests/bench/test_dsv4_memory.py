"""The V4 KV memory table's arithmetic (`bench.studies.dsv4_memory`) against the cache
tensors transformers' DeepseekV4 model allocates, on a tiny config with every layer type,
after a prefill and after decode steps that close and open compression windows."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache

from bench.studies.dsv4_memory import FLASH, PRO, V4Shape, v4_bytes, v4_state
from tests.worker.dsv4_checkpoints import CSA, HCA, TINY_V4


def tiny_shape() -> V4Shape:
    c = TINY_V4
    return V4Shape("tiny", "tests", c["num_hidden_layers"], c["head_dim"], c["sliding_window"],
                   c["index_head_dim"], tuple(c["layer_types"]),
                   tuple(c["compress_rates"].items()))


def hf_cache_parts(cache: DynamicCache) -> dict[str, int]:
    """Rows and bytes of every tensor the cache holds, by the study's parts."""
    parts = dict(window_rows=0, compressed_rows=0, indexer_rows=0, partial_bytes=0, bytes=0)
    for layer in cache.layers:
        parts["window_rows"] += layer.keys.shape[-2]  # K and V are one tensor (K = V)
        parts["bytes"] += layer.keys.numel() * layer.keys.element_size()
        for name, kv in getattr(layer, "compressed_kv", {}).items():
            parts["compressed_rows" if name == "compressor" else "indexer_rows"] += kv.shape[1]
            parts["bytes"] += kv.numel() * kv.element_size()
        partial = [*getattr(layer, "buffer_kv", {}).values(),
                   *getattr(layer, "buffer_gate", {}).values(),
                   *getattr(layer, "overlap_kv", {}).values(),
                   *getattr(layer, "overlap_gate", {}).values()]
        for t in partial:
            if t is not None:
                parts["partial_bytes"] += t.numel() * t.element_size()
    parts["bytes"] += parts["partial_bytes"]
    return parts


@pytest.mark.parametrize("prefill,decodes", [(3, 0), (21, 0), (13, 6), (16, 9)])
def test_state_matches_transformers_cache(prefill, decodes):
    from tests.worker.dsv4_checkpoints import tiny_v4

    hf = tiny_v4(dtype=torch.bfloat16)
    cache = DynamicCache(config=hf.config)
    ids = torch.randint(0, 256, (1, prefill + decodes), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hf(ids[:, :prefill], cache=cache, use_cache=True)
        for t in range(prefill, prefill + decodes):
            hf(ids[:, t : t + 1], cache=cache, use_cache=True)
    got = hf_cache_parts(cache)
    n, w = prefill + decodes, TINY_V4["sliding_window"]
    # transformers keeps the window's last W - 1 rows and appends the next token to them;
    # a ring written in place holds W: the study counts W
    state = v4_state(tiny_shape(), n, ring=w - 1, reserve_partial=False)
    assert got["window_rows"] == state.window_rows == 4 * min(n, w - 1)
    assert got["compressed_rows"] == state.compressed_rows == 2 * (n // 4) + n // 8
    assert got["indexer_rows"] == state.indexer_rows == 2 * (n // 4)
    assert got["partial_bytes"] == 2 * state.partial
    assert got["bytes"] == v4_bytes(state, "bf16")


def test_reserved_partial_block_is_the_worst_case():
    """A pool reserves `rate - 1` buffered tokens a layer: never less than any length holds."""
    shape = tiny_shape()
    reserved = v4_state(shape, 64).partial
    assert reserved == max(v4_state(shape, n, reserve_partial=False).partial for n in range(64))


def test_real_shapes_match_the_configs():
    """Flash: 2 sliding-window, 21 CSA, 20 HCA layers; Pro: 30 CSA, 31 HCA. A 2,048-token
    Flash request in bf16: 43 x 128 ring rows, 21 x 512 CSA and 20 x 16 HCA entries of 512
    values, 21 x 512 indexer keys of 128, and the reserved partial blocks."""
    assert (FLASH.layer_types.count(CSA), FLASH.layer_types.count(HCA)) == (21, 20)
    assert (PRO.layer_types.count(CSA), PRO.layer_types.count(HCA), len(PRO.layer_types)) == (
        30, 31, 61)
    s = v4_state(FLASH, 2048)
    assert s.window == 43 * 128 * 512
    assert s.compressed == (21 * 512 + 20 * 16) * 512 and s.indexer == 21 * 512 * 128
    assert s.partial == 20 * 127 * 2 * 512 + 21 * (3 * 2 * (1024 + 256) + 4 * 2 * (512 + 128))
    assert v4_bytes(s, "bf16") == 2 * (s.window + s.compressed + s.indexer + s.partial)


def test_sluice_fp8_pool_counts_its_scales():
    """Sluice's V4 pool a token, token layout: Flash's 43 K=V rows of 512 values and its
    share of the entry pools (21 CSA layers' entry and 128-value indexer key a 4 tokens,
    20 HCA layers' entry a 128) in bf16; under `--kv-dtype fp8` the rows and entries 1 byte
    a value and a 4-byte scale each, the indexer keys still bf16: 0.52x. Pro likewise (61
    layers: 30 CSA, 31 HCA)."""
    from bench.studies.dsv4_memory import sluice_layout

    csa_fp8, hca_fp8 = (512 + 4 + 2 * 128) / 4, (512 + 4) / 128
    assert sluice_layout(FLASH)["bytes_per_token"] == 50_912
    assert sluice_layout(FLASH, "fp8")["bytes_per_token"] == 26_322 == (
        43 * (512 + 4) + math.ceil(21 * csa_fp8 + 20 * hca_fp8))
    assert sluice_layout(PRO)["bytes_per_token"] == 72_312
    assert sluice_layout(PRO, "fp8")["bytes_per_token"] == 37_391 == (
        61 * (512 + 4) + math.ceil(30 * csa_fp8 + 31 * hca_fp8))
