"""A fake OpenAI-compatible engine for unit tests, served through httpx2.MockTransport.

It imitates what longctx reads from vLLM and SGLang (model listing, version,
server info, metrics, streamed chat with usage in the last chunk) and keeps a
crude prefix cache: a prompt's cached tokens are the characters it shares
with the longest earlier prompt, divided by four and rounded down to a
block. Faults can be queued per chat request. With ``tiers`` set it also
keeps a host tier: the GPU holds the last ``gpu_prompts`` prompts, the host
every earlier one (inclusive, as vLLM's native offloading and SGLang's
write-through HiCache are); a hit on a prompt only the host holds is a host
hit, exported in the metric generation ``tiers`` names. Real-engine tests cover what
the real engines do; this covers longctx's own logic, fast.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx2

CHARS_PER_TOKEN = 4


@dataclass
class Fault:
    """What to do to one chat request instead of answering it."""

    status: int | None = None  # answer with this HTTP status
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # fail the connection


@dataclass
class FakeEngine:
    engine: str = "vllm"  # "vllm", "sglang" or "generic"
    model: str = "fake-model"
    context_length: int = 32768
    block: int = 16
    report_cached: bool = True
    prefix_caching: bool = True
    answer: str = "a fake answer"
    finish_reason: str = "stop"  # "length": an answer cut at max_tokens
    faults: deque[Fault] = field(default_factory=deque)
    chat_bodies: list[dict[str, Any]] = field(default_factory=list)
    chat_headers: list[dict[str, str]] = field(default_factory=list)
    hits_total: int = 0
    #: Prompt tokens of the answered requests: vLLM's prefix-cache queries, SGLang's prompt tokens.
    queries_total: int = 0
    prompts: list[str] = field(default_factory=list)
    #: "vllm-by-source" (vLLM 0.32's counters), "vllm-024" (vLLM 0.24's, as the H200 run's
    #: /metrics held them: tokens by source and bytes), "vllm-transfers" (a vLLM counting bytes
    #: only), "sglang-hicache"; None: no host tier.
    tiers: str | None = None
    # SGLang's tensor-parallel ranks (its --hicache-size is per rank).
    tp_size: int = 1
    gpu_prompts: int = 1_000_000
    bytes_per_token: int = 64
    host_hits_total: int = 0
    stored_tokens_total: int = 0
    salts: list[str | None] = field(default_factory=list)
    # The cache canary's faults: added to the first token's logprob, or a
    # first token changed, in an answer that read cached tokens.
    perturb_cached_logprob: float = 0.0
    flip_cached_token: bool = False
    response_headers: dict[str, str] = field(default_factory=dict)
    started: float = 1_700_000_000.0  # process_start_time_seconds: tells two servers' /metrics apart
    #: The folder the model was loaded from (vLLM: /v1/models' root; SGLang: /server_info's model_path).
    checkpoint: str | None = None
    kv_cache_dtype: str = "auto"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    # -- routes ---------------------------------------------------------------

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path == "/v1/models":
            owner = {"vllm": "vllm", "sglang": "sglang"}.get(self.engine, "someone")
            entry = {"id": self.model, "owned_by": owner, "max_model_len": self.context_length}
            # SGLang's root is the served name; vLLM's the folder it loaded.
            entry["root"] = self.checkpoint if self.engine == "vllm" and self.checkpoint else self.model
            return httpx2.Response(200, json={"data": [entry]})
        if path == "/version" and self.engine == "vllm":
            return httpx2.Response(
                200, json={"version": "0.24.0" if self.tiers in ("vllm-024", "vllm-transfers") else "0.32.0"}
            )
        if path == "/server_info" and self.engine == "sglang":
            return httpx2.Response(
                200,
                json={
                    "version": "0.5.23",
                    "disable_radix_cache": not self.prefix_caching,
                    "enable_cache_report": self.report_cached,
                    "enable_metrics": True,
                    "page_size": 1,
                    "kv_cache_dtype": self.kv_cache_dtype,
                    "chunked_prefill_size": 8192,
                    "model_path": self.checkpoint or self.model,
                    "context_length": self.context_length,
                    "tp_size": self.tp_size,
                    **(
                        {
                            "enable_hierarchical_cache": True,
                            "hicache_size": 24,
                            "hicache_write_policy": "write_through",
                        }
                        if self.tiers == "sglang-hicache"
                        else {}
                    ),
                },
            )
        if path == "/metrics" and self.engine in ("vllm", "sglang"):
            return httpx2.Response(200, text=self.metrics())
        if path == "/v1/chat/completions" and request.method == "POST":
            return self.chat(request)
        return httpx2.Response(404, json={"detail": "Not Found"})

    def metrics(self) -> str:
        return f"process_start_time_seconds {self.started}\n" + self._counters()

    def _counters(self) -> str:
        model = f'model_name="{self.model}"'
        device = self.hits_total - self.host_hits_total
        if self.engine == "vllm":
            enabled = "True" if self.prefix_caching else "False"
            offload = ""
            if self.tiers is not None:
                offload = 'kv_offloading_backend="native",kv_offloading_size="24.0",'
            text = (
                "# HELP vllm:cache_config_info info\n"
                f'vllm:cache_config_info{{block_size="{self.block}",cache_dtype="{self.kv_cache_dtype}",'
                f'enable_prefix_caching="{enabled}",engine="0",{offload}{model}}} 1.0\n'
                f'vllm:prefix_cache_hits_total{{engine="0",{model}}} '
                f"{float(device if self.tiers else self.hits_total)}\n"
                f'vllm:prefix_cache_queries_total{{engine="0",{model}}} {float(self.queries_total)}\n'
            )
            loaded, stored = (
                self.host_hits_total * self.bytes_per_token,
                self.stored_tokens_total * self.bytes_per_token,
            )
            if self.tiers == "vllm-by-source":
                text += (
                    f'vllm:external_prefix_cache_hits_total{{engine="0",{model}}} '
                    f"{float(self.host_hits_total)}\n"
                    f'vllm:prompt_tokens_cached_by_source_total{{engine="0",{model},source="device"}} '
                    f"{float(device)}\n"
                    f'vllm:prompt_tokens_cached_by_source_total{{engine="0",{model},source="host"}} '
                    f"{float(self.host_hits_total)}\n"
                    f'vllm:prompt_tokens_cached_by_source_total{{engine="0",{model},source="disk"}} 0.0\n'
                    f'vllm:kv_offload_load_bytes_total{{engine="0",{model}}} {float(loaded)}\n'
                    f'vllm:kv_offload_store_bytes_total{{engine="0",{model}}} {float(stored)}\n'
                )
            elif self.tiers == "vllm-024":
                computed = self.stored_tokens_total
                text += (
                    f'vllm:prompt_tokens_by_source_total{{engine="0",{model},source="local_compute"}} '
                    f"{float(computed)}\n"
                    f'vllm:prompt_tokens_by_source_total{{engine="0",{model},source="local_cache_hit"}} '
                    f"{float(device)}\n"
                    f'vllm:prompt_tokens_by_source_total{{engine="0",{model},source="external_kv_transfer"}} '
                    f"{float(self.host_hits_total)}\n"
                    f'vllm:kv_offload_total_bytes_total{{engine="0",{model},transfer_type="CPU_to_GPU"}} '
                    f"{float(loaded)}\n"
                    f'vllm:kv_offload_total_bytes_total{{engine="0",{model},transfer_type="GPU_to_CPU"}} '
                    f"{float(stored)}\n"
                    f'vllm:kv_offload_load_bytes_total{{engine="0",{model}}} {float(loaded)}\n'
                    f'vllm:kv_offload_store_bytes_total{{engine="0",{model}}} {float(stored)}\n'
                )
            elif self.tiers == "vllm-transfers":
                text += (
                    f'vllm:kv_offload_total_bytes_total{{engine="0",{model},transfer_type="CPU_to_GPU"}} '
                    f"{float(loaded)}\n"
                    f'vllm:kv_offload_total_bytes_total{{engine="0",{model},transfer_type="GPU_to_CPU"}} '
                    f"{float(stored)}\n"
                )
            return text
        prompts = f'sglang:prompt_tokens_total{{is_streaming="true",{model}}} {float(self.queries_total)}\n'
        if self.tiers == "sglang-hicache":
            return prompts + (
                f'sglang:cached_tokens_total{{cache_source="device",{model}}} {float(device)}\n'
                f'sglang:cached_tokens_total{{cache_source="host",{model}}} {float(self.host_hits_total)}\n'
                f"sglang:hicache_host_total_tokens{{{model}}} 393216.0\n"
            )
        return (
            prompts
            + f'sglang:cached_tokens_total{{cache_source="device",{model}}} {float(self.hits_total)}\n'
        )

    def chat(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        with self.lock:
            self.chat_bodies.append(body)
            self.chat_headers.append(dict(request.headers))
            fault = self.faults.popleft() if self.faults else None
        if fault is not None:
            if fault.drop:
                raise httpx2.ConnectError("connection dropped by the fake engine", request=request)
            return httpx2.Response(
                fault.status or 500, json=fault.body or {"error": "fault"}, headers=fault.headers
            )
        prompt = json.dumps(body["messages"])
        tokens = len(prompt) // CHARS_PER_TOKEN
        if tokens > self.context_length:
            return self.overflow(tokens)
        # The salt namespaces the cache, as on the real engines.
        salt = body.get("cache_salt")
        cached = self.cached_for(prompt, salt) if self.prefix_caching else 0
        # Without a host tier every cached token is on the GPU (and no second lookup is made).
        host = 0
        if self.tiers and self.prefix_caching:
            host = cached - self.cached_for(prompt, salt, last=self.gpu_prompts)
        with self.lock:
            self.prompts.append(prompt)
            self.salts.append(salt)
            self.hits_total += cached
            self.queries_total += tokens
            self.host_hits_total += host
            self.stored_tokens_total += tokens - cached
        details: dict[str, Any] | None = {"cached_tokens": cached} if self.report_cached else None
        usage = {
            "prompt_tokens": tokens,
            "completion_tokens": 3,
            "total_tokens": tokens + 3,
            "prompt_tokens_details": details,
        }
        scored = self.scored(body, cached)
        if not body.get("stream", False):
            # A plain answer (an image count asks one): the usage in the body.
            message = {"role": "assistant", "content": self.answer}
            choice = {"index": 0, "message": message, "finish_reason": self.finish_reason, **scored}
            return httpx2.Response(200, json={"id": "c1", "choices": [choice], "usage": usage})
        chunks = [
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": self.model,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                ],
            },
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": self.model,
                "choices": [{"index": 0, "delta": {"content": self.answer}, "finish_reason": None, **scored}],
            },
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": self.model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish_reason}],
            },
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": self.model,
                "choices": [],
                "usage": usage,
            },
        ]
        if self.tiers == "sglang-hicache" and body.get("return_cached_tokens_details"):
            chunks[-1]["sglext"] = {"cached_tokens_details": {"device": cached - host, "host": host}}
        text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        headers = {"content-type": "text/event-stream", **self.response_headers}
        return httpx2.Response(200, text=text, headers=headers)

    def scored(self, body: dict[str, Any], cached: int) -> dict[str, Any]:
        """The answer's token ids and logprobs, when asked for (one token a word of the answer)."""
        words = self.answer.split(" ")
        ids = [sum(map(ord, word)) for word in words]
        logprobs = [-0.1 * (index + 1) for index in range(len(words))]
        if cached:
            logprobs[0] += self.perturb_cached_logprob
            if self.flip_cached_token:
                ids[0] += 1
                words[0] = words[0] + "!"
        extra: dict[str, Any] = {}
        if body.get("return_token_ids"):
            extra["token_ids"] = ids
        if body.get("logprobs"):
            extra["logprobs"] = {
                "content": [
                    {
                        "token": word,
                        "logprob": logprob,
                        "top_logprobs": [
                            {"token": word, "logprob": logprob},
                            {"token": "~", "logprob": -9.0},
                        ],
                    }
                    for word, logprob in zip(words, logprobs, strict=True)
                ]
            }
        return extra

    def overflow(self, tokens: int) -> httpx2.Response:
        if self.engine == "sglang":
            message = (
                f"The input ({tokens} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
            return httpx2.Response(
                400, json={"object": "error", "message": message, "type": "BadRequestError"}
            )
        message = (
            f"This model's maximum context length is {self.context_length} tokens. However, your prompt "
            f"contains {tokens} input tokens. Please reduce the length of the input messages."
        )
        return httpx2.Response(
            400, json={"error": {"message": message, "type": "BadRequestError", "code": 400}}
        )

    def cached_for(self, prompt: str, salt: str | None = None, last: int | None = None) -> int:
        """Tokens of ``prompt`` cached under ``salt``: shared with an earlier one (of the ``last`` ones)."""
        best = 0
        with self.lock:
            seen_salted = list(zip(self.prompts, self.salts, strict=True))
            if last is not None:
                seen_salted = seen_salted[-last:]
            earlier = [seen for seen, its in seen_salted if its == salt]
        for seen in earlier:
            shared = 0
            for a, b in zip(seen, prompt, strict=False):
                if a != b:
                    break
                shared += 1
            best = max(best, shared)
        tokens = best // CHARS_PER_TOKEN
        return tokens - tokens % self.block
