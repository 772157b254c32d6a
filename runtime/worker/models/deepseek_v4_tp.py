"""DeepSeek-V4 under tensor parallelism (`--tp N`): what each of the N ranks holds, and
along which dim each checkpoint tensor is cut (`split_dim`, the model's `tp_split_dim`).

Each rank holds:

- of the attention, H / N query heads: their rows of `wq_b` (whole heads; the per-head
  query norm has no weight), their sinks (`attn_sink`), and the o_groups / N output groups
  they form (their rows of `wo_a`, the columns of `wo_b` those rows feed). `wo_b`'s partial
  sums are all-reduced: the attention's one collective. Groups are runs of whole heads, so
  N must divide `o_groups` (and so the heads); a model where it does not is refused,
  naming the field.
- whole, on every rank: the query LoRA (`wq_a`, its norm: every head reads all of it), the
  one K=V head (`wkv`, its norm and rotation), so the pool's K=V rows (every rank stores
  each token's whole row, as MQA needs), the compressors with their entry pools and rings
  (they make the entries every head reads), and the Lightning Indexer. Cutting the
  indexer's heads would cost an all-reduce of its `[T, entries]` scores every CSA layer
  and step (T times a quarter of the context, a long prefill's), and sum them in another
  order than `--tp 1` does, so near ties could pick other entries; whole, it scores from
  the same inputs on every rank, its picks are identical everywhere and `--tp 1`'s, for
  weights a fraction of the attention's (Flash: `wq_b` 1024 x 8192, `weights_proj`).
- of the mixture of experts, every routed expert at 1/N of its width (`w1`, `w3` rows,
  `w2` columns: the fused MoE kernel runs on each rank's shards) and the shared expert
  likewise; the router whole (`gate.weight`, its selection bias, the hash table
  `tid2eid`). The routed and shared partial sums are all-reduced once.
- whole: the hyper-connections (`hc_*`, `hc_head`) and the norms; by vocabulary rows: the
  embedding and the LM head (`head`), the logits gathered, as in every family.

Routing and the indexer's top-k read the residual streams, which the all-reduces leave
identical on every rank, through whole weights: every rank computes the same scores from
the same bits and picks the same experts and entries, and the logits are `--tp 1`'s up
to the order of the sums.

Block fp8 checkpoints cut each projection's scales with its blocks: a rank's share must be
whole 128-blocks (`wq_b`: H / N * head_dim rows; `wo_a`: o_groups / N * o_lora_rank rows
and `wo_b` as many columns; the shared expert: moe_intermediate_size / N), else loading
refuses it, naming the tensor (`BlockFp8Linear.check_part`). The routed experts, fp8 or
fp4 dequantized at load, are cut after. The MTP draft head runs at `--tp 1` only.
"""

from __future__ import annotations

VOCAB_ROWS = ("model.embed_tokens.weight", "head.weight")
ATTENTION = {"wq_b": 0, "wo_a": 0, "wo_b": 1}  # modules of `attn` (the indexer's are whole)
EXPERT = {"w1": 0, "w3": 0, "w2": 1}  # of each routed expert and of the shared expert


def split_dim(hf_name: str) -> int | None:
    """The dim along which checkpoint tensor `hf_name` (transformers layout; a block scale
    is cut as its weight) is split over the ranks; None for a tensor every rank holds."""
    if hf_name in VOCAB_ROWS:
        return 0
    *_, parent, module, leaf = ("", *hf_name.split("."))
    if leaf == "attn_sink":
        return 0
    if parent == "attn":
        return ATTENTION.get(module)
    return EXPERT.get(module)
