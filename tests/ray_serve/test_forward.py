"""What the ingress hands a replica: the prompt read for routing, the headers passed on."""

from __future__ import annotations

import json

from runtime.ray_serve.forward import forwarded_headers, prefix_key


def test_prefix_key_reads_each_api_s_prompt():
    assert prefix_key(json.dumps({"model": "m", "prompt": "hello"}).encode()) == "hello"
    messages = [{"role": "user", "content": "hi"}]
    assert prefix_key(json.dumps({"messages": messages}).encode()) == json.dumps(
        messages, separators=(",", ":"))
    assert prefix_key(json.dumps({"input_ids": [1, 2, 3]}).encode()) == "[1,2,3]"
    assert prefix_key(json.dumps({"text": "abc"}).encode()) == "abc"
    assert prefix_key(b"not json") == prefix_key(b"[1]") == prefix_key(b"{}") == ""


def test_hop_by_hop_headers_stay_behind():
    got = forwarded_headers([("Host", "a"), ("Content-Type", "application/json"),
                             ("Authorization", "Bearer k"), ("Content-Length", "3"),
                             ("Connection", "keep-alive"), ("Date", "x"), ("Server", "y")])
    assert got == (("content-type", "application/json"), ("authorization", "Bearer k"))
