"""Talking to inference servers: vLLM, SGLang, or any OpenAI-compatible one.

- :mod:`~longctx.backends.base`: :class:`Backend` and :func:`connect`: one server or
  replicas, discovery, delivery with retries and failover (the package's own names);
- :mod:`~longctx.backends.http`: JSON, text and server-sent events, failures as longctx errors;
- :mod:`~longctx.backends.client`: longctx's own sync HTTP client (answers whole or as they arrive);
- :mod:`~longctx.backends.connections`: keep-alive HTTP/1.1 connections over ``http.client``,
  the network under that client;
- :mod:`~longctx.backends.httpx2_bridge`: the only httpx2 import: the async client, and httpx2
  transports (a test's mock, a proxy from the environment) under the sync client;
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

from __future__ import annotations

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# The package's names (its ``__all__``): the backend and connect, the recipes' engines, the waits,
# imported on first use (PEP 562),
# so that importing one of its modules (http, tokenizer) does not load the others.
_EXPORTS: dict[str, str] = {
    "Backend": "longctx.backends.base",
    "DeliveryHooks": "longctx.backends.base",
    "ReplicaStatus": "longctx.backends.base",
    "Sent": "longctx.backends.base",
    "ServerInfo": "longctx.backends.base",
    "connect": "longctx.backends.base",
    "recipe_engines": "longctx.backends.engines",
    "recipe_host_tiers": "longctx.backends.engines",
    "CountWatch": "longctx.backends.tokenizer",
    "watched_counts": "longctx.backends.tokenizer",
    "Wait": "longctx.backends.waits",
    "Waits": "longctx.backends.waits",
}

if TYPE_CHECKING:
    from longctx.backends.base import Backend as Backend
    from longctx.backends.base import DeliveryHooks as DeliveryHooks
    from longctx.backends.base import ReplicaStatus as ReplicaStatus
    from longctx.backends.base import Sent as Sent
    from longctx.backends.base import ServerInfo as ServerInfo
    from longctx.backends.base import connect as connect
    from longctx.backends.engines import recipe_engines as recipe_engines
    from longctx.backends.engines import recipe_host_tiers as recipe_host_tiers
    from longctx.backends.tokenizer import CountWatch as CountWatch
    from longctx.backends.tokenizer import watched_counts as watched_counts
    from longctx.backends.waits import Wait as Wait
    from longctx.backends.waits import Waits as Waits


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
