"""The HTTP front: the Starlette app and its uvicorn server (`server`), the checks before
any route (`guard`, `connection`, `request_body`) and Sluice's `POST /generate`
(`generate`, `sampling_json`); the OpenAI and SGLang routes are served from their own
families."""
