"""Sluice's frontend: SGLang-style programs with gen, select, fork, roles and streaming.

    import frontend as sl

    @sl.function
    def qa(s, question):
        s += sl.system("You are a helpful assistant.")
        s += sl.user(question)
        s += sl.assistant(sl.gen("answer", max_tokens=64, stop="\\n"))

    sl.set_default_backend(sl.RuntimeEndpoint("http://127.0.0.1:30000"))
    print(qa.run(question="What is the capital of France?")["answer"])
"""

from frontend.backends import (
    Backend,
    EngineBackend,
    HttpBackend,
    RpcBackend,
    RuntimeEndpoint,
)
from frontend.function import BatchResult, SlFunction, function, set_default_backend
from frontend.ir import assistant, gen, select, system, user
from frontend.state import ForkGroup, ProgramState

__all__ = [
    "Backend", "BatchResult", "EngineBackend", "ForkGroup", "HttpBackend", "ProgramState",
    "RpcBackend", "RuntimeEndpoint", "SlFunction", "assistant", "function", "gen", "select",
    "set_default_backend", "system", "user",
]
