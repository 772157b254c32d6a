"""The edit workload: chat requests asking SmolLM2 to rewrite a paragraph with its
spelling fixed, so the answer repeats most of its input (where prompt lookup drafts well)."""

from __future__ import annotations

PARAGRAPHS = (
    "The river town woke up slowly. Fishermen carried their nets down to the water, "
    "while the bakery on the corner filled the street with the smell of fresh bread. "
    "Children ran past the old church, late for school again, and the mayor waved at "
    "them from his window.",
    "Our team shiped the new release on friday. It fixes the login bug, makes the search "
    "page twice as fast, and adds a dark theme that many users asked for. Please update "
    "your apps and tell us what you think.",
    "To make a simple tomato soup, cook one onion in olive oil until soft, add two cans of "
    "tomatos and a cup of water, then simmer for twenty minutes. Blend it, add salt and "
    "pepper, and serve it with toasted bread.",
    "The museum will be closed on monday for cleaning. On tuesday it opens again at nine "
    "in the morning, with a new room about ancient maps and the ships that used them. "
    "Tickets are free for students and teachers.",
)
INSTRUCTION = ("Rewrite the following paragraph with its spelling mistakes corrected. "
               "Reply with the corrected paragraph only.\n\n")


def edit_prompts(tokenizer, n: int) -> list[list[int]]:
    """`n` chat prompts (token ids), cycling through the paragraphs."""
    out = []
    for i in range(n):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": INSTRUCTION + PARAGRAPHS[i % len(PARAGRAPHS)]}],
            tokenize=False, add_generation_prompt=True)
        out.append(tokenizer.encode(text))
    return out
