"""The wire protocol: every record is tagged by its class name and belongs to a channel,
and a record sent on a channel decodes as itself."""

from __future__ import annotations

import importlib
import pkgutil
import typing

import msgspec
import pytest

import runtime.wire
from runtime.wire.api_input import ApiInput, BatchOut, Limits, ReqOut
from runtime.wire.lifecycle import Ready, Shutdown
from runtime.wire.model_info import ModelInfo, RoleMarkers
from runtime.wire.record import WireRecord
from runtime.wire.request_output import FinishReason, RequestOutput
from runtime.wire.rpc import RpcInput, RpcModelInfo, RpcOutput
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq, GenerateReq, SchedulerInput
from runtime.wire.worker_channel import BatchPlan, RowInit, StepResult, WorkerInput, WorkerOutput

CHANNELS = (SchedulerInput, ApiInput, WorkerInput, WorkerOutput, RpcInput, RpcOutput)


def _records() -> list[type]:
    for info in pkgutil.iter_modules(runtime.wire.__path__):
        importlib.import_module(f"runtime.wire.{info.name}")
    found, todo = [], list(WireRecord.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_record_is_tagged_by_its_class_name_and_rides_a_channel():
    # Ready goes to the supervisor alone; RowInit rides inside BatchPlan, ReqOut in BatchOut
    on_a_channel = {cls for union in CHANNELS for cls in typing.get_args(union)} | {
        Ready, RowInit, ReqOut}
    records = _records()
    assert len(records) == 27
    for cls in records:
        config = cls.__struct_config__
        assert (config.tag, config.array_like) == (cls.__name__, True), cls
        assert cls in on_a_channel, f"{cls.__name__} is on no channel"


@pytest.mark.parametrize("union, record", [
    (SchedulerInput, GenerateReq("r1", [1, 2], SamplingParams(max_tokens=3, stop=["x"]), [2])),
    (SchedulerInput, AbortReq("r1", FinishReason.ERROR)),
    (SchedulerInput, Shutdown()),
    (ApiInput, BatchOut([ReqOut("r1", [5], finish_reason=FinishReason.STOP)], ["r2"], [7])),
    (ApiInput, Limits(max_context=8, max_req_input_len=7, max_running=2, kv_slots=64)),
    (WorkerInput, BatchPlan(1, [0], [0], [2], [4, 5], [0, 1], [True],
                            inits=[RowInit(0, SamplingParams(temperature=0.0))])),
    (WorkerOutput, StepResult(1, [9], [])),
    (RpcOutput, RequestOutput(rid="r1", text="hi", token_ids=[3], matched_stop="!")),
    (RpcOutput, RpcModelInfo("r1", ModelInfo(model="m", max_model_len=8, chat_roles={
        "user": RoleMarkers(first_prefix="<s>", prefix="[u]", suffix="[/u]")}))),
])
def test_a_record_sent_on_its_channel_decodes_as_itself(union, record):
    frame = msgspec.msgpack.encode(record)
    assert msgspec.msgpack.decode(frame)[0] == type(record).__name__  # the tag leads
    assert msgspec.msgpack.Decoder(union).decode(frame) == record
