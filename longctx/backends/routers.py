"""Routers in front of the replicas, as a client can see them: which, and which workers they list.

A router answers the OpenAI routes like an engine, and its ``/metrics``
too: vllm-router passes ``/metrics`` on to one of its workers (which one
is its choice, so two readings may come from two replicas), smg answers
it with an error. A counter check through a router then compares the
growth of one replica's counter, or of two different ones, with what all
replicas served: a nonsense figure. Both routers announce themselves on
``GET /workers``, a route neither engine has (checked against vllm-router
0.1.17 and smg 1.13.0, run over the test fleet's replicas):

- vllm-router: ``{"workers": [{"url", "model_id", "worker_type",
  "is_healthy", "load", ...}]}``;
- smg: ``{"workers": [{"id", "url", "runtime_type", "is_healthy",
  "status", ...}], "total", "stats"}``; its answers carry
  ``x-smg-routed-worker-id`` (the worker's URL) and its errors
  ``x-smg-error-code``.

Which of the two it is: vllm-router also answers ``GET /list_workers``
(``{"urls": [...]}``), which smg does not have (its ``/workers`` entries
over real vLLM workers and vllm-router's look alike): the router registry
(:func:`longctx.backends.engines.routers`) holds each router's probe.

:func:`detect_router` reads that list, so a counter check can read each
worker's counter directly (:meth:`Backend.counters
<longctx.backends.base.Backend.counters>`) or, when the workers cannot be
reached from here, say why it is skipped.
"""

from __future__ import annotations

from typing import Any

from longctx.backends.engines import routers
from longctx.backends.http import HttpEndpoint
from longctx.backends.profiles import RouterProfile
from longctx.errors import BackendError
from longctx.recordtypes import record_type

__all__ = ["RouterInfo", "detect_router"]

#: How long the one ``/workers`` request of discovery may take.
DETECT_TIMEOUT = 5.0


@record_type
class RouterInfo:
    """A router at ``url`` (its root), by ``name``, and the root URLs of the workers it lists as healthy."""

    name: str
    url: str
    workers: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "workers": list(self.workers)}


def detect_router(endpoint: HttpEndpoint) -> RouterInfo | None:
    """The router behind ``endpoint``, or None for an engine (or anything without ``/workers``)."""
    try:
        listing = endpoint.get_json("/workers", timeout=DETECT_TIMEOUT)
    except BackendError:
        return None
    if parse_workers(listing, endpoint.root_url, "") is None:
        return None
    return parse_workers(listing, endpoint.root_url, _which(endpoint).name)


def _which(endpoint: HttpEndpoint) -> RouterProfile:
    """Of the registry's routers that list workers, the first whose probe answers, else the one without."""
    listing = [router for router in routers() if router.lists_workers]
    for router in listing:
        if router.probe is None:
            continue
        route, key = router.probe
        try:
            answer = endpoint.get_json(route, timeout=DETECT_TIMEOUT)
        except BackendError:
            continue
        if isinstance(answer, dict) and key in answer:
            return router
    return next(router for router in listing if router.probe is None)


def parse_workers(listing: Any, url: str, name: str) -> RouterInfo | None:
    """A router's ``/workers`` answer as the :class:`RouterInfo` of ``name``; None when it is not one."""
    if not isinstance(listing, dict) or not isinstance(listing.get("workers"), list):
        return None
    entries = [entry for entry in listing["workers"] if isinstance(entry, dict) and entry.get("url")]
    healthy = tuple(
        str(entry["url"]).rstrip("/")
        for entry in entries
        if entry.get("is_healthy", True) is not False and entry.get("worker_type", "regular") == "regular"
    )
    return RouterInfo(name, url, healthy)
