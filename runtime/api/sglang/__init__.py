"""SGLang's native HTTP API: its `/generate` request and reply forms (`request`, `reply`)
and its other endpoints (`serving`)."""
