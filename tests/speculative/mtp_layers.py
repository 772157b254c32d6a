"""Test helper: a tiny random DeepSeek-V3 checkpoint with a multi-token-prediction layer
in the released key layout (`model.layers.{L}.*`), and a plain-torch reference of the
layer's forward and greedy drafting (its decoder layer run by transformers)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from tests.worker.test_deepseek import BASE, random_deepseek, tiny_deepseek


def append_to_checkpoint(folder: Path, tensors: dict[str, torch.Tensor], **fields) -> None:
    """Add `tensors` to `folder`'s model.safetensors and `fields` to its config.json."""
    path = folder / "model.safetensors"
    weights = load_file(str(path)) | {k: v.contiguous() for k, v in tensors.items()}
    save_file(weights, str(path))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


L = BASE["num_hidden_layers"]  # the MTP layer's index in the checkpoint
H = BASE["hidden_size"]


class MtpReference:
    """The target (transformers, L layers) and its MTP layer: `layer` is a one-layer
    transformers DeepSeek-V3 whose layer 0 is the MTP layer's decoder layer (MoE) and whose
    final norm is `shared_head.norm`; `extra` holds enorm, hnorm and eh_proj."""

    def __init__(self, folder: Path, own_head: bool = False, copy: bool = False,
                 drop: str = "", nextn: int = 1) -> None:
        self.target = tiny_deepseek("v3", folder)
        torch.manual_seed(1)
        self.layer = random_deepseek("v3", num_hidden_layers=1, first_k_dense_replace=0)
        gen = torch.Generator().manual_seed(2)
        self.extra = {"enorm.weight": 1 + 0.1 * torch.randn(H, generator=gen),
                      "hnorm.weight": 1 + 0.1 * torch.randn(H, generator=gen),
                      "eh_proj.weight": 0.1 * torch.randn(H, 2 * H, generator=gen)}
        if copy:  # out = the norm of hnorm(h): the target's prediction one position earlier
            self.extra["eh_proj.weight"] = torch.cat([torch.zeros(H, H), torch.eye(H)], 1)
            self.extra["enorm.weight"].fill_(1.0)
            self.extra["hnorm.weight"].fill_(1.0)
            with torch.no_grad():
                for name, p in self.layer.named_parameters():
                    if "o_proj" in name or "down_proj" in name or "norm" in name:
                        p.fill_(0.0 if "proj" in name else 1.0)
        self.head = (self.layer.lm_head if own_head else self.target.lm_head).weight  # [V, h]
        self._write(folder, own_head, drop, nextn)

    def _write(self, folder: Path, own_head: bool, drop: str, nextn: int) -> None:
        """Add the layer's tensors to the target's checkpoint in `folder`, as released."""
        self.layer.save_pretrained(folder / "layer")
        mtp = {}
        for name, t in load_file(str(folder / "layer" / "model.safetensors")).items():
            if name.startswith("model.layers.0."):
                mtp[name.replace("model.layers.0.", "")] = t
        mtp |= {"shared_head.norm.weight": self.layer.model.norm.weight.detach(),
                "embed_tokens.weight": self.layer.model.embed_tokens.weight.detach(),  # unread
                **self.extra}
        if own_head:
            mtp["shared_head.head.weight"] = self.layer.lm_head.weight.detach()
        mtp.pop(drop, None)
        append_to_checkpoint(folder, {f"model.layers.{L}.{k}": v for k, v in mtp.items()},
                             num_nextn_predict_layers=nextn)

    def drafts(self, tokens: list[int], k: int) -> list[int]:
        """The layer's k greedy drafts after `tokens` (t_0..t_P), from the target's final
        hidden states of positions 0..P-1, each step recomputing the whole sequence."""
        eps = self.layer.config.rms_norm_eps
        rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w  # noqa: E731
        with torch.no_grad():
            hidden = self.target.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
            embed = self.target.model.embed_tokens.weight  # [V, h]
            ids, drafts = list(tokens[1:]), []
            for _ in range(k):
                x = torch.cat([rms(embed[ids], self.extra["enorm.weight"]),
                               rms(hidden, self.extra["hnorm.weight"])], dim=-1)  # [n, 2h]
                x = F.linear(x, self.extra["eh_proj.weight"])  # [n, h]
                out = self.layer.model(inputs_embeds=x[None]).last_hidden_state[0, -1]  # [h]
                drafts.append(int((self.head @ out).argmax()))
                ids.append(drafts[-1])
                hidden = torch.cat([hidden, out[None]])
        return drafts
