"""What `bench.host.output`'s stand-in scheduler sends: the output ids of every request,
and one `BatchOut` per decode step at full speed, as the real scheduler sends them."""

from __future__ import annotations

PROMPT_LEN = 16  # prompt tokens of every request


def output_ids(model: str, n: int) -> list[int]:
    """The `n` ids every request gets: unicode-heavy text for a tokenizer, else ids."""
    from runtime.model_config import resolve_model

    spec = resolve_model(model)
    if spec.tokenizer_path is None:
        return [3 + (i * 37) % 1000 for i in range(n)]
    from transformers import AutoTokenizer

    from bench.host.api import TEXT

    ids = AutoTokenizer.from_pretrained(spec.tokenizer_path).encode(TEXT)
    return (ids * (n // len(ids) + 1))[:n]


def stand_in(sched_in: str, api_in: str, n: int, ids: list[int], conn) -> None:
    """The stand-in scheduler: once `n` requests arrived, every step's BatchOut at once
    (lone tokens in the columns, unless this runtime's BatchOut has none); then tells
    `conn` whether it used the columns."""
    import msgspec
    import zmq

    try:
        from runtime.wire.api_input import BatchOut, Limits, ReqOut
        from runtime.wire.request_output import FinishReason
        from runtime.wire.scheduler_input import GenerateReq, SchedulerInput
    except ModuleNotFoundError:  # a baseline from before runtime/wire
        from runtime.messages import (
            BatchOut,
            FinishReason,
            GenerateReq,
            Limits,
            ReqOut,
            SchedulerInput,
        )

    ctx = zmq.Context()
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inbox.bind(sched_in)
    outbox.connect(api_in)
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(SchedulerInput)
    outbox.send(enc.encode(Limits(max_context=8192, max_req_input_len=8191, max_running=n,
                                  kv_slots=1 << 22)))
    keys = []
    while len(keys) < n:
        msg = dec.decode(inbox.recv())
        if isinstance(msg, GenerateReq):
            keys.append(msg.rid)
    columns = "rids" in BatchOut.__struct_fields__
    frames = []
    for s, tok in enumerate(ids):
        last = s == len(ids) - 1
        if s == 0 or last or not columns:
            frames.append(enc.encode(BatchOut([ReqOut(
                k, [tok], finish_reason=FinishReason.LENGTH if last else None,
                prompt_tokens=PROMPT_LEN if s == 0 else 0) for k in keys])))
        else:
            frames.append(enc.encode(BatchOut([], keys, [tok] * n)))
    for frame in frames:
        outbox.send(frame)
    conn.send(columns)
    outbox.close(linger=10_000)
    inbox.close(linger=0)
    ctx.term()
