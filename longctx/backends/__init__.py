"""Talking to inference servers: vLLM, SGLang, or any OpenAI-compatible one.

- :mod:`~longctx.backends.base`: :class:`Backend` and ``connect``: one server or
  replicas, discovery, delivery with retries and failover;
- :mod:`~longctx.backends.http`: the only httpx2 import: JSON, text and server-sent events;
- :mod:`~longctx.backends.chat`: the chat and completion requests, streamed and accumulated;
- :mod:`~longctx.backends.profiles`: what longctx knows of an engine or a router, as data;
- :mod:`~longctx.backends.engines`: the registry: the engine and router profiles, the one
  module that names them;
- :mod:`~longctx.backends.metrics`: Prometheus text;
- :mod:`~longctx.backends.tiers`: cache tiers below the GPU and their counters;
- :mod:`~longctx.backends.tokenizer`: the server's tokenizer;
- :mod:`~longctx.backends.images`: whether the served model takes images, and each image's tokens;
- :mod:`~longctx.backends.routers`: a router in front, found on its worker list;
- :mod:`~longctx.backends.waits`: the requests waiting on a silent server, for a caller to show;
- :mod:`~longctx.backends.prefill_wait`: how long a request may wait for its first token (a cold
  prefill is not a stall): the prompts sent, the server's measured prefill rate;
- :mod:`~longctx.backends.continuation`: requests that continue a stored prompt in a server
  session without resending it (SGLang's sessions).
"""
