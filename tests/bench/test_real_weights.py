"""`python -m bench.offline.real_weights --tiny` on the CPU: SmolLM2's real weights, greedy
tokens equal to HF transformers', and perplexities of the fixed text beside HF's."""

import pytest

from bench.offline import real_weights
from bench.offline.real_text import fixed_text, prompts


def test_the_prompts_and_the_text_are_fixed():
    chat = lambda q: f"<user>{q}</user>"  # noqa: E731
    assert len(prompts(chat)) == 50 and prompts(chat) == prompts(chat)
    assert len(fixed_text(90_000)) >= 90_000 and fixed_text(5_000) == fixed_text(5_000)


@pytest.mark.timeout(900)
def test_tiny_run_matches_hf(tmp_path):
    res = real_weights.main(["--tiny", "--dtypes", "float32", "--variants", "bf16,kv-int8",
                             "--out", str(tmp_path / "rw")])
    (greedy,) = res["greedy"]
    assert greedy["equal"] == greedy["prompts"] == 3 and greedy["parted"] == []
    ppl = {r["variant"]: r for r in res["ppl"]}
    assert set(ppl) == {"Sluice bf16", "Sluice kv-int8", "HF bf16"}
    assert len({r["tokens"] for r in ppl.values()}) == 1  # every variant scores every token
    # Sluice bf16 and HF bf16 score the same text with the same weights: close, not equal
    # (bf16 kernels and chunked prefill round differently)
    assert ppl["Sluice bf16"]["ppl"] == pytest.approx(ppl["HF bf16"]["ppl"], rel=0.05)
    assert "| Sluice kv-int8 |" in (tmp_path / "rw.md").read_text()
