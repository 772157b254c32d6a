"""`HeadGraphs`: CUDA graphs of a draft head's step (`HeadDrafter`) over one token a
request.

A head step reads, besides its tokens, the hidden state each token follows, and gives the
head's own output and its greedy token: so the step these graphs capture is the head's
(the target's embedding of the tokens, the head's layer, `DraftHead.draft_ids`), in
`GraphRunner`'s decode graphs, with the hidden states in a static buffer of their own
that `run` fills. Padding rows read whatever that buffer holds past the batch, attend
nothing and write the head pool's slot 0; their outputs are dropped. The head reads its
entries slot by slot (`HeadForward`), so its graphs have page size 1.
"""

from __future__ import annotations

import torch

from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.graph_runner import GraphRunner
from runtime.worker.models.causal_lm import CausalLM


class HeadGraphs(GraphRunner):
    """Decode graphs of `head` (a `DraftHead`) beside `target`, up to `rows` rows: each
    returns its rows' greedy ids and the head's outputs."""

    def __init__(self, head, target: CausalLM, attn: AttentionBackend, rows: int,
                 max_context: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(head, attn, rows, max_context, device)
        self.target = target
        self.hidden = torch.zeros(self.sizes[-1], head.hidden_size, dtype=dtype,
                                  device=device)  # [N, h]

    def _outputs(self, fb: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """(greedy ids [B], the head's outputs [B, h])."""
        embeds = self.target.model.embed_tokens(fb.input_ids)  # [B, h]
        out = self.model(embeds, self.hidden[: fb.batch_size], fb, self.attn)  # [B, h]
        return self.model.draft_ids(out, self.target), out

    def run(self, fb: ForwardBatch, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The head's step over `fb` (a batch `can_run` takes) after the hidden states
        `hidden` [B, h]: (greedy ids [B], outputs [B, h]), views of the graph's static
        buffers, valid until its next replay."""
        self.hidden[: fb.batch_size].copy_(hidden, non_blocking=True)
        return self.replay(fb)
