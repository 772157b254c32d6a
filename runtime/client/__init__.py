"""`Client` / `AsyncClient`: the native RPC clients (ZMQ DEALER, msgpack).

    client = Client("tcp://127.0.0.1:30001")
    out = client.generate("Hello", max_tokens=32, temperature=0)  # the whole RequestOutput
    for delta in client.generate("Hello", stream=True, max_tokens=32):  # RequestOutput deltas
        print(delta.text, end="")

Requests always stream over the wire, and non-streaming calls join the deltas here, so
`timeout` can bound the silence between two messages: a server that dies mid-request
raises `ServerTimeout` instead of hanging, while long generations still work.
One `Client` per thread (`blocking.py`); `AsyncClient` (`aio.py`) serves any number of
tasks on one loop. Both send `api_key` (default: the SLUICE_API_KEY environment variable)
with every request; a server with another key raises `Unauthorized`. Before its first
request a client asks the server for its model info, which says the largest message the
server reads: a larger request raises `MessageTooLarge` and is never sent (the server
would drop the connection without a reply). What both share, from building a request to
turning a reply into an output or a typed error, is in `core.py`.
"""

from runtime.client.aio import AsyncClient
from runtime.client.blocking import Client

__all__ = ["AsyncClient", "Client"]
