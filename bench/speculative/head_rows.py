"""`python -m bench.speculative --algorithm eagle|mtp`: the cost of drafting with a head
over the target's hidden states.

One row a batch size, run plainly and with the head (greedy, outputs checked identical,
the rule that turns a failing request's speculation off disabled), on prompts of random
ids:

- `eagle`: the EAGLE head in `--draft-model`; with none, and a `dummy:` target (default
  `dummy:spec-target`), a random EAGLE head of the target's shape written to a temporary
  folder (`random_eagle_head`). Random weights measure what drafting costs a verify step,
  not an acceptance rate (the head agrees with the target on almost no token): the
  break-even column is the tokens a verify step must yield to match plain decoding.
- `mtp`: the multi-token-prediction layer of `--model`'s own checkpoint (a DeepSeek-V3
  family folder with `num_nextn_predict_layers` >= 1).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.speculative.draft_rows import (
    PROMPT_LEN,
    base_config,
    measure,
    outputs_and_run,
    table,
)
from runtime.model_config import resolve_model
from runtime.worker.speculative.eagle_head import EagleHead
from runtime.worker.speculative.eagle_layout import read_layout

STD = 0.02


def random_eagle_head(folder: Path, target) -> Path:
    """Write a random EAGLE (v1) head for the target of transformers config `target` to
    `folder`: a one-layer Llama config of its shape, and every tensor the head reads (as
    `EagleHead.checkpoint_targets` names them), matrices ~ N(0, STD), norms ones."""
    h, heads = target.hidden_size, target.num_attention_heads
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
           "intermediate_size": target.intermediate_size, "num_hidden_layers": 1,
           "num_attention_heads": heads, "hidden_act": "silu",
           "num_key_value_heads": getattr(target, "num_key_value_heads", None) or heads,
           "head_dim": getattr(target, "head_dim", None) or h // heads,
           "vocab_size": target.vocab_size, "rms_norm_eps": target.rms_norm_eps,
           "rope_theta": getattr(target, "rope_theta", 10000.0),
           "rope_scaling": getattr(target, "rope_scaling", None),
           "max_position_embeddings": target.max_position_embeddings}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(0)
    weights = {"fc.weight": torch.randn(h, 2 * h, generator=gen) * STD,
               "layers.0.input_layernorm.weight": torch.ones(h)}
    save_file(weights, str(folder / "model.safetensors"))  # what the layout is read from
    with torch.device("meta"):
        head = EagleHead(read_layout(folder, target))
    for name, (param, _, rows) in head.checkpoint_targets().items():
        if name not in weights:
            shape = (rows, *param.shape[1:])
            weights[name] = (torch.ones(shape) if name.endswith("norm.weight")
                             else torch.randn(shape, generator=gen) * STD)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def run(args) -> dict:
    base = base_config(args)
    if args.algorithm == "mtp":
        label, cfg = "the checkpoint's MTP layer", base.replace(speculative_algorithm="mtp")
    else:
        folder = args.draft_model or str(random_eagle_head(
            Path(tempfile.mkdtemp()) / "eagle", resolve_model(args.model).hf_config()))
        label = args.draft_model or "a random head"
        cfg = base.replace(speculative_algorithm="eagle", speculative_draft_model=folder)
    rows = measure(args, base, [(args.algorithm, label, cfg)])
    return {"model": args.model, "algorithm": args.algorithm, "head": label,
            "random_head": args.algorithm == "eagle" and not args.draft_model,
            "draft_tokens": args.draft_tokens, "max_tokens": args.max_tokens,
            "prompt_len": PROMPT_LEN, "torch_threads": torch.get_num_threads(), "rows": rows}


def report(res: dict, command: str, date: str) -> str:
    b = min(r["batch"] for r in res["rows"])
    first = next(r["draft_model"] for r in res["rows"] if r["batch"] == b)
    random = res["random_head"]
    lines = [
        f"# Speculative decoding with {res['algorithm']} ({res['head']}): its cost on "
        f"{res['device']}",
        "",
        f"Question: What does drafting with {res['head']} ({res['algorithm']}) cost per "
        "verify step, and how many tokens does a verify step yield?",
        f"Answer: at batch {b} a verify step costs {first['break_even']} plain steps and "
        f"yields {first['accept_length']} tokens, {first['speedup']}x plain decoding's "
        "tokens/s"
        + (" (random head weights: a cost, not an acceptance rate)" if random else "")
        + ". " + outputs_and_run(res, command, date),
        "",
        f"Target `{res['model']}`, prompts of {res['prompt_len']} random ids, greedy, up to "
        f"{res['max_tokens']} output tokens, {res['draft_tokens']} draft tokens per verify "
        "step. A verify step runs the head's k draft steps, the target's forward over "
        "k + 1 positions, and the head over the step's tokens with the target's hidden "
        "states. ms/step: wall time over scheduler steps; break-even len: the tokens a "
        "verify step must yield to match plain decoding (its ms/step over a plain step's).",
        "",
    ]
    return "\n".join(lines + table(res["rows"]))
