"""What `bench.offline.real_weights` feeds the model: 50 prompts and a fixed English text.

The prompts mix plain continuations, arithmetic, code and chat-templated questions. The
text for perplexity is generated, not shipped: the docstrings of a fixed list of Python
standard-library modules, in a fixed order, so the same interpreter version gives the same
text (the results record that version and the token count).
"""

from __future__ import annotations

import importlib
import inspect

TOPICS = ["the ocean", "a lighthouse", "winter mornings", "a city at night", "old maps",
          "a chess game", "bread baking", "a long train ride", "the first computers",
          "honeybees"]
PLAIN = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fibonacci(n):",
         "The quick brown fox jumps over the lazy dog. The quick brown fox",
         "In 1969, the first person to walk on the moon was", "Water boils at",
         "List three fruits:", "Translate to French: good morning",
         "import numpy as np\n\ndef softmax(x):"]
DOC_MODULES = ["collections", "itertools", "functools", "json", "pathlib", "textwrap",
               "argparse", "logging", "subprocess", "threading", "asyncio.tasks", "heapq",
               "bisect", "statistics", "fractions", "decimal", "datetime", "calendar",
               "string", "difflib", "csv", "zipfile", "tarfile", "shutil", "tempfile",
               "unittest.case", "typing", "dataclasses", "enum", "contextlib"]


def prompts(chat_template) -> list[str]:
    """50 prompts; `chat_template(question) -> str` renders the 20 chat ones."""
    out = list(PLAIN)
    out += [f"Question: what is {a} plus {b}? Answer:" for a, b in
            zip(range(7, 77, 7), range(3, 103, 10))]
    out += [f"Write one sentence about {t}." for t in TOPICS]
    out += [chat_template(f"Tell me a short fact about {t}.") for t in TOPICS]
    out += [chat_template(f"Explain {t} to a child in two sentences.") for t in TOPICS]
    return out


def fixed_text(min_chars: int) -> str:
    """At least `min_chars` characters of English prose from standard-library docstrings."""
    parts: list[str] = []
    size = 0
    for name in DOC_MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            if len(doc) > 80:
                parts.append(doc)
                size += len(doc) + 2
                if size >= min_chars:
                    return "\n\n".join(parts)
    raise ValueError(f"the docstrings hold only {size} characters, fewer than {min_chars}")
