"""SGLang frontend programs run against a server: `python -m tests.e2e.sglang_program URL`
prints what they produced as one JSON object (read by `test_sglang_frontend.py`).

It runs in a process of its own: importing `sglang` patches `transformers` and sets cache
variables, which must not leak into the test process.
"""

from __future__ import annotations

import json
import sys

import sglang as sgl

YEAR = r"\d{4}"


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8, stop="\n", temperature=0))


@sgl.function
def profile(s, name):
    s += sgl.user(f"Who is {name}?")
    s += sgl.assistant("A " + sgl.select("kind", choices=["person", "place", "thing"])
                       + ". Born in " + sgl.gen("year", max_tokens=8, regex=YEAR))


@sgl.function
def two_tips(s, topic):
    s += f"Two tips about {topic}:\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"{i + 1}. " + sgl.gen("tip", max_tokens=4, stop="\n", temperature=0)
    forks.join()
    s += "Tip 1: " + forks[0]["tip"]


def main(url: str) -> dict:
    # SmolLM2 speaks ChatML; SGLang does not guess that from the name "smollm2"
    backend = sgl.RuntimeEndpoint(url, chat_template_name="chatml")
    sgl.set_default_backend(backend)
    out: dict = {"model_name": backend.get_model_name()}
    backend.flush_cache()  # idle: a 200

    state = qa.run(question="Name a colour.")
    streamed = qa.run(question="Name a colour.", stream=True)
    out["streamed"] = "".join(streamed.text_iter("answer"))
    out["answer"] = state["answer"]
    out["answer_finish"] = state.get_meta_info("answer")["finish_reason"]
    backend.flush_cache()  # right after requests: done once their last batch completed
    out["server_info"] = backend.get_server_info()

    state = profile.run(name="Ada Lovelace")
    out["kind"], out["year"] = state["kind"], state["year"]

    states = two_tips.run_batch([{"topic": "sleep"}, {"topic": "tea"}], num_threads=2)
    out["tip_texts"] = [s.text() for s in states]
    out["tips"] = [s["tip"] for s in states]
    out["errors"] = [str(s.error()) for s in states if s.error() is not None]
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
