"""Test helper: a tiny random DeepSeek-V4 checkpoint with a multi-token-prediction layer in
the released layout (`mtp.0.*`, beside the target's transformers-layout tensors), and a
torch reference of the layer's logits built from transformers' own DeepSeek-V4 modules
(its decoder layer and final hyper-connection head, run by a one-layer DeepseekV4Model)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from tests.speculative.mtp_layers import append_to_checkpoint
from tests.worker.dsv4_checkpoints import SWA, TINY_V4, tiny_v4
from tests.worker.dsv4_released import FP8_MODULES, released_name, write_released
from tests.worker.fp8_checkpoints import quantize

L = TINY_V4["num_hidden_layers"]  # the MTP block's entry in compress_ratios
D = TINY_V4["hidden_size"]
RATIOS = [0, 4, 8, 4]  # the target's layers (TINY_V4's layer_types), as compress_ratios
# transformers' names of a block's output projections: attention's, the experts', shared's
BLOCK_OUTPUTS = ("o_b_proj.weight", "experts.down_proj", "down_proj.weight")
INDEX = "model.safetensors.index.json"
MTP_FILE = "model-mtp.safetensors"


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class V4MtpReference:
    """The target (transformers) and its MTP layer: `layer` is a one-layer transformers
    DeepSeek-V4 (sliding window, top-k MoE) whose layer 0 is the MTP block, whose `hc_head`
    and `norm` are the layer's and whose `lm_head` is its own `head`; `extra` holds enorm,
    hnorm, e_proj and h_proj. `copy`: a layer whose logits are the target's at the
    position before (one stream, the block and e_proj zero, h_proj the identity).
    `ratio`: the block's compress_ratios entry (None: none given); `drop`: a released
    tensor name (under `mtp.0.`) left out; `nextn`: num_nextn_predict_layers."""

    def __init__(self, folder: Path, own_head: bool = False, copy: bool = False,
                 ratio: int | None = 0, drop: str = "", nextn: int = 1) -> None:
        shape = {"hc_mult": 1} if copy else {}
        self.target = tiny_v4(None if copy else folder, **shape)
        if copy:
            self._repeating_target(folder)
        self.layer = tiny_v4(seed=1, num_hidden_layers=1, layer_types=[SWA],
                             mlp_layer_types=["moe"], **shape)
        gen = torch.Generator().manual_seed(2)
        self.extra = {name: (1 + 0.1 * torch.randn(D, generator=gen)) for name in
                      ("enorm.weight", "hnorm.weight")}
        self.extra |= {name: 0.1 * torch.randn(D, D, generator=gen) for name in
                       ("e_proj.weight", "h_proj.weight")}
        self.eps = self.layer.config.rms_norm_eps
        if copy:
            self._copy_the_target()
        self.head = (self.layer.lm_head if own_head else self.target.lm_head).weight  # [V, D]
        self._write(folder, own_head, ratio, drop, nextn)

    def _repeating_target(self, folder: Path) -> None:
        """The target, saved to `folder`, with its LM head its embedding and its blocks'
        outputs halved: its prediction is often its input token, so it repeats tokens about
        half of the time (these seeds)."""
        with torch.no_grad():
            self.target.lm_head.weight.copy_(self.target.model.embed_tokens.weight)
            for name, p in self.target.named_parameters():
                if name.endswith(BLOCK_OUTPUTS):
                    p.mul_(0.5)
        self.target.save_pretrained(folder)

    def _copy_the_target(self) -> None:
        """One stream s: x = hnorm(s) = s / rms(s), the block passes it on (its attention's
        and experts' outputs zero, its one-stream mixing 1), and norm(hc_head(x)) is the
        target's final hidden state at the same position (RMS norms ignore the scale)."""
        self.extra |= {"enorm.weight": torch.ones(D), "hnorm.weight": torch.ones(D),
                       "e_proj.weight": torch.zeros(D, D), "h_proj.weight": torch.eye(D)}
        with torch.no_grad():
            for name, p in self.layer.named_parameters():
                if name.endswith(BLOCK_OUTPUTS):
                    p.zero_()
            self.layer.model.norm.weight.copy_(self.target.model.norm.weight)

    def _write(self, folder: Path, own_head: bool, ratio: int | None, drop: str,
               nextn: int) -> None:
        """Add the layer's tensors to the target's checkpoint in `folder`, as released."""
        self.layer.save_pretrained(folder / "layer")
        mtp = {}
        for name, t in load_file(str(folder / "layer" / "model.safetensors")).items():
            released = released_name(name)
            if released.startswith("layers.0."):
                mtp[released.removeprefix("layers.0.")] = t
            elif released.startswith(("hc_head_", "norm.")):
                mtp[released] = t
        mtp |= {"emb.tok_emb.weight": self.target.model.embed_tokens.weight.detach(),  # unread
                **self.extra}
        if own_head:
            mtp["head.weight"] = self.layer.lm_head.weight.detach()
        mtp.pop(drop, None)
        fields = {} if ratio is None else {"compress_ratios": [*RATIOS, ratio]}
        append_to_checkpoint(folder, {f"mtp.0.{k}": v for k, v in mtp.items()},
                             num_nextn_predict_layers=nextn, **fields)

    @torch.no_grad()
    def logits(self, tokens: list[int], drafts: list[int]) -> list[torch.Tensor]:
        """The layer's logits [V] of each draft step after `tokens` (t_0..t_P) when it
        drafted `drafts`: step j reads the target's streams (before its hc_head) at
        positions 0..P-1, then the layer's own outputs of steps 0..j-1, each step
        recomputing the whole sequence at positions 0, 1, ... (the streams' positions)."""
        streams = self._run(self.target.model, torch.tensor([tokens[:-1]]), None)[0]
        embed = self.target.model.embed_tokens.weight  # [V, D]
        ids, out = list(tokens[1:]), []
        for j in range(len(drafts)):
            e = embed[ids].clone()  # [n, D]
            e[0] = 0  # the token after position 0
            x = (F.linear(rms(streams, self.extra["hnorm.weight"], self.eps),
                          self.extra["h_proj.weight"])
                 + F.linear(rms(e, self.extra["enorm.weight"], self.eps),
                            self.extra["e_proj.weight"])[:, None, :])  # [n, hc, D]
            after, hidden = self._run(self.layer.model, None, x)
            out.append(self.head @ hidden[-1])  # [V]
            streams = torch.cat([streams, after[-1:]])
            ids.append(drafts[j])
        return out

    @staticmethod
    def _run(model, input_ids: torch.Tensor | None,
             streams: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the streams [n, hc, D] the model's `hc_head` collapses, its final hidden states
        [n, D]) over `input_ids` [1, n], or with `streams` [n, hc, D] as its first layer's
        input (at positions 0..n-1)."""
        seen = []
        hooks = [model.hc_head.register_forward_pre_hook(lambda _, args: seen.append(args[0]))]
        if streams is not None:
            hooks.append(model.layers[0].register_forward_pre_hook(
                lambda _, args: (streams[None], *args[1:])))
            n = streams.shape[0]
            kwargs = {"inputs_embeds": torch.zeros(1, n, streams.shape[-1]),
                      "position_ids": torch.arange(n)[None]}
        else:
            kwargs = {"input_ids": input_ids}
        try:
            hidden = model(**kwargs, use_cache=False).last_hidden_state[0]  # [n, D]
        finally:
            for hook in hooks:
                hook.remove()
        return seen[0][0], hidden


def released_fp8_with_mtp(ref: V4MtpReference, folder: Path, root: Path) -> Path:
    """`ref`'s target as DeepSeek releases it in fp8 (`write_released`, in `root`) with the
    MTP layer `ref` wrote into `folder` in place of that helper's stand-in, its projections
    (`e_proj` and `h_proj` too) block fp8 with e8m0 scales, in a shard of its own: the
    released folder."""
    out, _ = write_released(ref.target, root, quant="fp8")
    index = json.loads((out / INDEX).read_text())
    for file in set(index["weight_map"].values()):
        kept = {n: t for n, t in load_file(str(out / file)).items() if not n.startswith("mtp.")}
        save_file(kept, str(out / file))
    tensors = {}
    for name, t in load_file(str(folder / "model.safetensors")).items():
        module = name.removesuffix(".weight")
        if not name.startswith("mtp."):
            continue
        if name.endswith(".weight") and (FP8_MODULES.match(module)
                                         or module.endswith(("e_proj", "h_proj"))):
            q, scale = quantize(t, "block", e8m0=True)
            tensors |= {name: q, f"{module}.scale": scale.to(torch.float8_e8m0fnu)}
        else:
            tensors[name] = t
    save_file(tensors, str(out / MTP_FILE))
    index["weight_map"] = {n: f for n, f in index["weight_map"].items()
                           if not n.startswith("mtp.")} | dict.fromkeys(tensors, MTP_FILE)
    (out / INDEX).write_text(json.dumps(index))
    config, mine = (json.loads((f / "config.json").read_text()) for f in (out, folder))
    config |= {k: mine[k] for k in ("compress_ratios", "num_nextn_predict_layers")}
    (out / "config.json").write_text(json.dumps(config))
    return out
