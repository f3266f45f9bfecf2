"""Measured retention beside the estimate, on both CPU engines; writes the ``traffic-retention`` section.

Starts the test harness's servers (``LONGCTX_HARNESS_DIR``): a vLLM with 48 KV blocks
(``--num-gpu-blocks-override 48``: 6,144 tokens at the CPU build's block 128) and SGLang with the
harness's ``--max-total-tokens 40000``; measures how many packs each keeps
(:func:`longctx.serving.retention.measure_retention`) at two pack sizes, beside the estimate the
job scheduler and ``longctx plan`` make from the server's KV size. Usage: ``retention.py [--write]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import machine, write_section  # type: ignore[import-not-found]  # noqa: E402 - the benchmarks' own helpers

from longctx.backends.base import connect  # noqa: E402
from longctx.serving.retention import measure_retention  # noqa: E402
from longctx.testing.harness import EngineHarness, harness_dir  # noqa: E402
from longctx.testing.servers import start_vllm  # noqa: E402

RUNS = {"vllm (48 blocks)": (1000, 2000), "sglang (40,000 tokens)": (2000, 4000)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true")
    arguments = parser.parse_args()
    harness = EngineHarness(harness_dir(HERE.parents[1]))
    rows = []
    try:
        small = harness.extra_server(
            "vllm-small-kv",
            lambda h: start_vllm(h.environment("vllm"), h.model(), h.base_dir, name="vllm-small-kv",
                                 extra_args=["--num-gpu-blocks-override", "48", "--max-model-len", "4096",
                                             "--kv-cache-memory-bytes", str(64 << 20)]),
        )  # fmt: skip
        servers = {"vllm (48 blocks)": small.api_base}
        for name, sizes in RUNS.items():
            url = servers.get(name) or harness.server("sglang").api_base
            with connect(url) as backend:
                version = backend.info.version or "?"
                for size in sizes:
                    report = measure_retention(backend, size)
                    partial = [p for p in report.probes if p.kept and p.cached_tokens and p.prompt_tokens
                               and p.cached_tokens < 0.9 * p.prompt_tokens]  # fmt: skip
                    kept_ttft = [
                        p.ttft_seconds for p in report.probes if p.kept and p.ttft_seconds is not None
                    ]
                    gone = [p for p in report.probes if not p.kept]
                    rows.append(
                        f"| {name}, {report.engine} {version} | {size:,} | {report.packs_sent} | {report.kept_packs} "
                        f"({len(partial)} in part) | {report.estimated_packs} ({report.server_kv_tokens:,} KV tokens) "
                        f"| {report.kv_tokens:,} | {max(kept_ttft) * 1000:.0f} ms | "
                        f"{(gone[0].ttft_seconds or 0) * 1000:.0f} ms |"
                    )
                    print(rows[-1], flush=True)
        harness.stop_extra("vllm-small-kv")
    finally:
        harness.close()
    body = "\n".join(
        [
            "## Retention: packs a server really keeps, beside the estimate from its KV size",
            "",
            "`benchmarks/traffic/retention.py` (`longctx retention`): distinct packs of about the given size "
            "sent one after another, then again newest first; the packs that come back with at least half "
            "their prompt cached before the first that does not are kept (a pack kept in part counts; its "
            "cached tokens go into the KV figure). *estimate*: the server's KV tokens over the packs' mean "
            "size, as the job scheduler and `longctx plan` count. *KV tokens measured*: the cached tokens of "
            "the packs kept, what `longctx job --kv-tokens` takes. TTFT: slowest kept re-send, and the first "
            f"re-send that was not kept. The test model on the CPU engines. Machine: {machine()}.",
            "",
            "| server | pack tokens asked | packs sent | kept (measured) | estimate | KV tokens measured "
            "| TTFT kept (max) | TTFT first gone |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    print(body)
    if arguments.write:
        write_section("traffic-retention", body)


if __name__ == "__main__":
    main()
