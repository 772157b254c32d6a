"""Test helper: a tiny random Llama target and tiny random EAGLE / EAGLE-3 head folders
in the released key layout (safetensors, or PyTorch `.bin` files), and a plain-torch
reference of a head's forward and greedy drafting."""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from tests.worker.checkpoints import tiny_checkpoint

TARGET_LAYERS = 4
HEAD = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, rms_norm_eps=1e-6, rope_theta=10000.0,
            max_position_embeddings=512, model_type="llama", hidden_act="silu")
DRAFT_VOCAB = 96  # EAGLE-3's own LM head: the first 96 of a random order of the ids


def target_checkpoint(folder: Path) -> torch.nn.Module:
    """A random tiny HF Llama of TARGET_LAYERS layers saved to `folder` (returned, fp32)."""
    return tiny_checkpoint("llama3-rope", folder, num_hidden_layers=TARGET_LAYERS)


def write_head(folder: Path, eagle3: bool, *, input_norm: bool = True, fc_bias: bool = True,
               drop: str = "", seed: int = 1, config_only: dict | None = None,
               **config) -> dict[str, torch.Tensor]:
    """Save a random head (config fields `config` changed, tensor `drop` left out; the
    fields `config_only` changed in config.json after the tensors are made) to `folder`;
    return its tensors by checkpoint name."""
    cfg = {**HEAD, **config}
    if eagle3:
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": DRAFT_VOCAB,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}, **cfg}
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], 16
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen) * 0.2  # noqa: E731
    prefix = "midlayer." if eagle3 else "layers.0."
    w = {"fc.weight": rand(h, (3 if eagle3 else 2) * h),
         f"{prefix}self_attn.q_proj.weight": rand(q, (2 if eagle3 else 1) * h),
         f"{prefix}self_attn.k_proj.weight": rand(kv, (2 if eagle3 else 1) * h),
         f"{prefix}self_attn.v_proj.weight": rand(kv, (2 if eagle3 else 1) * h),
         f"{prefix}self_attn.o_proj.weight": rand(h, q),
         f"{prefix}post_attention_layernorm.weight": 1 + rand(h),
         f"{prefix}mlp.gate_proj.weight": rand(inter, h),
         f"{prefix}mlp.up_proj.weight": rand(inter, h),
         f"{prefix}mlp.down_proj.weight": rand(h, inter),
         "embed_tokens.weight": rand(cfg["vocab_size"], h)}  # released heads carry it: unread
    if fc_bias:
        w["fc.bias"] = rand(h)
    if input_norm:
        w[f"{prefix}input_layernorm.weight"] = 1 + rand(h)
    if eagle3:
        hot = torch.randperm(cfg["vocab_size"], generator=gen)[:DRAFT_VOCAB].sort().values
        w |= {f"{prefix}hidden_norm.weight": 1 + rand(h), "norm.weight": 1 + rand(h),
              "lm_head.weight": rand(DRAFT_VOCAB, h),
              "d2t": hot - torch.arange(DRAFT_VOCAB),
              "t2d": torch.zeros(cfg["vocab_size"], dtype=torch.bool).index_fill(0, hot, True)}
    w.pop(drop, None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**cfg, **(config_only or {})}))
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    return w


def write_bin_head(folder: Path, source: Path, w: dict[str, torch.Tensor],
                   shards: int = 1) -> None:
    """Save head `w` (the tensors `write_head` saved to `source`, whose config.json is
    copied) to `folder` as PyTorch state dicts: `pytorch_model.bin`, or `shards` files
    `pytorch_model-0000i-of-0000n.bin` that `pytorch_model.bin.index.json` lists."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "config.json", folder / "config.json")
    names = list(w)
    files = ["pytorch_model.bin"] if shards == 1 else [
        f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin" for i in range(shards)]
    for i, file in enumerate(files):
        state = OrderedDict((name, w[name]) for name in names[i::shards])
        state._metadata = OrderedDict({"": {"version": 1}})  # as `Module.state_dict()` has
        torch.save(state, folder / file)
    if shards > 1:
        weight_map = {name: files[i % shards] for i, name in enumerate(names)}
        (folder / "pytorch_model.bin.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_copy_head(folder: Path) -> None:
    """Save an EAGLE head whose output is the hidden state it reads (attention and MLP
    outputs zero): it drafts the token the target predicted one position earlier, so its
    drafts are accepted where the target repeats a token."""
    w = write_head(folder, False, fc_bias=False)
    h = w["fc.weight"].shape[0]
    w["fc.weight"] = torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1)
    w["layers.0.self_attn.o_proj.weight"].zero_()
    w["layers.0.mlp.down_proj.weight"].zero_()
    save_file(w, str(folder / "model.safetensors"))


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    if weight is None:
        return x
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [n, heads, d] rotated at positions 0..n-1 (halves, as HF Llama)."""
    n, _, d = x.shape
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # [d/2]
    ang = torch.outer(torch.arange(n, dtype=torch.float32), inv)  # [n, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * cos + rot * sin


def head_outputs(w: dict[str, torch.Tensor], eagle3: bool, embeds: torch.Tensor,
                 hidden: torch.Tensor) -> torch.Tensor:
    """The head over a whole sequence, causally: embeddings [n, h] of tokens 1..n and the
    hidden states [n, h] of positions 0..n-1 they follow -> outputs [n, h] (pre-norm)."""
    p = "midlayer." if eagle3 else "layers.0."
    if eagle3:
        residual = hidden
        x = torch.cat([_rms(embeds, w[f"{p}input_layernorm.weight"]),
                       _rms(hidden, w[f"{p}hidden_norm.weight"])], dim=-1)
    else:
        residual = x = F.linear(torch.cat([embeds, hidden], -1), w["fc.weight"], w.get("fc.bias"))
        x = _rms(x, w.get(f"{p}input_layernorm.weight"))
    n, hd = len(x), 16
    q = F.linear(x, w[f"{p}self_attn.q_proj.weight"]).view(n, -1, hd)
    k = F.linear(x, w[f"{p}self_attn.k_proj.weight"]).view(n, -1, hd)
    v = F.linear(x, w[f"{p}self_attn.v_proj.weight"]).view(n, -1, hd)
    q, k = _rope(q, HEAD["rope_theta"]), _rope(k, HEAD["rope_theta"])
    rep = q.shape[1] // k.shape[1]
    att = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(rep, 1)
                                         .transpose(0, 1), v.repeat_interleave(rep, 1)
                                         .transpose(0, 1), is_causal=True)  # [heads, n, hd]
    h = F.linear(att.transpose(0, 1).reshape(n, -1), w[f"{p}self_attn.o_proj.weight"])
    residual = h + residual
    x = _rms(residual, w[f"{p}post_attention_layernorm.weight"])
    mlp = F.linear(F.silu(F.linear(x, w[f"{p}mlp.gate_proj.weight"]))
                   * F.linear(x, w[f"{p}mlp.up_proj.weight"]), w[f"{p}mlp.down_proj.weight"])
    return mlp + residual


def reference_drafts(w: dict[str, torch.Tensor], eagle3: bool, target: torch.nn.Module,
                     tokens: list[int], features: torch.Tensor, k: int) -> list[int]:
    """The head's k greedy drafts after `tokens` (t_0..t_P), given the target's features
    [P, w] of positions 0..P-1, each step recomputing the whole sequence."""
    embed = target.model.embed_tokens.weight  # [V, h]
    hidden = F.linear(features, w["fc.weight"], w.get("fc.bias")) if eagle3 else features
    ids = torch.tensor(tokens[1:])
    drafts = []
    for _ in range(k):
        out = head_outputs(w, eagle3, embed[ids], hidden)[-1]  # [h]
        if eagle3:
            draft = int(F.linear(_rms(out, w["norm.weight"]), w["lm_head.weight"]).argmax())
            token = draft + int(w["d2t"][draft])
        else:
            token = int(target.lm_head(out).argmax())
        drafts.append(token)
        ids, hidden = torch.cat([ids, torch.tensor([token])]), torch.cat([hidden, out[None]])
    return drafts


def target_features(target: torch.nn.Module, tokens: list[int], eagle3: bool) -> torch.Tensor:
    """transformers' features of every position of `tokens`: its final hidden states, or
    the outputs of layers 0, 1 and 2 concatenated (EAGLE-3): [n, w]."""
    with torch.no_grad():
        states = target.model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    if eagle3:
        return torch.cat([states[1][0], states[2][0], states[3][0]], dim=-1)
    return states[-1][0]
