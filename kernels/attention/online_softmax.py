"""The online softmax every attention kernel runs over its key tiles (16-bit, quantized and MLA
decode, extend, MLA extend): a tile's scores folded into the running max and sum, in base 2
(the scores carry sm_scale * log2(e)), so that the output is rescaled, never recomputed."""

import triton
import triton.language as tl


@triton.jit
def softmax_fold(qk, m, l_sum):
    """Fold one tile's base-2 logits qk `[M, N]` into the running max m `[M]` and sum l_sum
    `[M]`: returns (max, sum, alpha `[M]` that rescales what came before, weights p `[M, N]`).
    Every row must see a key in the first tile it folds, so that its max is finite."""
    m_new = tl.maximum(m, tl.max(qk, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(qk - m_new[:, None])  # [M, N]
    l_sum = l_sum * alpha + tl.sum(p, 1)
    return m_new, l_sum, alpha, p
