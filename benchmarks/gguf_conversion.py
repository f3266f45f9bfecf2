"""Benchmark: the real model's conversion, transformers' GGUF loader against longctx's numpy converter.

Both convert the same joined GGUF (the real-model candidates' parts from the
harness's ``downloads/``, joined and sha256-checked by
:func:`longctx.testing.real_model.join_gguf`) into a float32 safetensors folder,
one after the other in one run, alternating which goes first each round:

- ``transformers``: transformers' GGUF loader (``AutoModelForCausalLM.from_pretrained(gguf_file=...)``
  and ``save_pretrained``, as the harness converted until 2026-12-06), run with a Python that has
  transformers, torch, gguf and accelerate (``--transformers-python``; by default the harness's old
  ``envs/real-model-conversion`` overlay on the vLLM environment);
- ``longctx``: ``python -m longctx.testing.gguf_conversion`` with this Python (numpy and gguf).

Each is a process of its own: its wall time, its CPU time (user + system, from ``wait4``) and its
peak resident memory. The machine's load average is printed with the figures (the test machine is
shared). ``--write`` replaces the ``gguf-conversion`` section of docs/testing.md::

    LONGCTX_HARNESS_DIR=/work/harness .venv/bin/python benchmarks/gguf_conversion.py --write
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from longctx.testing.real_model import CANDIDATES, DEFAULT_MODEL, join_gguf

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "testing.md"
SECTION = "gguf-conversion"

# The harness's converter until 2026-12-06 (longctx/testing/_real_model_converter.py), kept here as the
# baseline: transformers' loader dequantizes, save_pretrained writes the folder.
TRANSFORMERS_CONVERTER = """
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf_path, out = Path(sys.argv[1]), Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
for holder in (model, model.config):
    for name in ("hf_quantizer", "quantization_config"):
        if getattr(holder, name, None) is not None:
            try:
                delattr(holder, name)
            except AttributeError:
                setattr(holder, name, None)
if hasattr(model, "is_quantized"):
    model.is_quantized = False
model.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
"""


@dataclass(frozen=True)
class Measured:
    converter: str
    seconds: float
    cpu_seconds: float
    peak_rss_mib: float


def _run(converter: str, command: list[str], env: dict[str, str]) -> Measured:
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.monotonic() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.exit(f"{converter} failed ({process.returncode}):\n{errors.decode(errors='replace')[-3000:]}")
    return Measured(converter, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def measure(gguf: Path, scratch: Path, transformers_python: Path, rounds: int) -> list[Measured]:
    """Each converter ``rounds`` times on ``gguf``, alternating which goes first."""
    script = scratch / "transformers_converter.py"
    script.write_text(TRANSFORMERS_CONVERTER)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    commands = {
        "transformers": [str(transformers_python), str(script)],
        "longctx": [sys.executable, "-m", "longctx.testing.gguf_conversion"],
    }
    results: list[Measured] = []
    for round_ in range(rounds):
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        for converter in order:
            out = scratch / f"out-{converter}"
            shutil.rmtree(out, ignore_errors=True)
            print(f"[gguf-conversion] round {round_ + 1}: {converter}", file=sys.stderr, flush=True)
            results.append(_run(converter, [*commands[converter], str(gguf), str(out)], env))
            shutil.rmtree(out, ignore_errors=True)
    return results


def section(key: str, results: list[Measured], loads: tuple[str, str], versions: str) -> str:
    spec = CANDIDATES[key]
    today = datetime.date.today().isoformat()
    lines = [
        f"Converting {spec.upstream.split(' (')[0]}'s GGUF ({spec.gguf_bytes / 1e6:.0f} MB, the harness's "
        f"real model) into a float32 safetensors folder, both converters in one run on {today}, "
        f"{platform.machine()}, {os.cpu_count()} cores, shared with other sessions (load average "
        f"{loads[0]} at the start, {loads[1]} at the end); {versions}. Written by "
        "`benchmarks/gguf_conversion.py --write`.",
        "",
        "| converter | run | wall | CPU (user + system) | peak memory |",
        "|---|---:|---:|---:|---:|",
    ]
    counts: dict[str, int] = {}
    for result in results:
        counts[result.converter] = counts.get(result.converter, 0) + 1
        name = (
            "transformers' GGUF loader (before)"
            if result.converter == "transformers"
            else "longctx.testing.gguf_conversion (numpy)"
        )
        lines.append(
            f"| {name} | {counts[result.converter]} | {result.seconds:.1f} s | {result.cpu_seconds:.1f} s "
            f"| {result.peak_rss_mib:,.0f} MiB |"
        )
    return "\n".join(lines)


def write_section(body: str) -> None:
    text = DOCS.read_text(encoding="utf-8")
    block = f"<!-- begin: {SECTION} -->\n{body.rstrip()}\n<!-- end: {SECTION} -->"
    pattern = re.compile(rf"<!-- begin: {SECTION} -->.*?<!-- end: {SECTION} -->", re.S)
    if not pattern.search(text):
        sys.exit(f"docs/testing.md has no {SECTION} markers")
    DOCS.write_text(pattern.sub(lambda _: block, text), encoding="utf-8")


def _versions(transformers_python: Path) -> str:
    probe = "import transformers, torch; print(transformers.__version__, torch.__version__)"
    theirs = subprocess.run(
        [str(transformers_python), "-c", probe], capture_output=True, text=True, check=True
    )
    transformers_version, torch_version = theirs.stdout.split()
    return (
        f"transformers {transformers_version} with torch {torch_version}; numpy {metadata.version('numpy')} "
        f"with gguf {metadata.version('gguf')}"
    )


def main() -> int:
    harness = Path(os.environ.get("LONGCTX_HARNESS_DIR") or ROOT / ".cache" / "harness")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(CANDIDATES))
    parser.add_argument(
        "--transformers-python",
        type=Path,
        default=harness / "envs" / "real-model-conversion" / "bin" / "python",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="replace the section in docs/testing.md")
    args = parser.parse_args()
    spec = CANDIDATES[args.model]
    with tempfile.TemporaryDirectory(prefix="gguf-conversion-", dir=harness) as scratch:
        gguf = Path(scratch) / "model.gguf"
        join_gguf(spec, harness / "downloads" / spec.key, gguf)
        start_load = f"{os.getloadavg()[0]:.1f}"
        results = measure(gguf, Path(scratch), args.transformers_python, args.rounds)
        loads = (start_load, f"{os.getloadavg()[0]:.1f}")
    body = section(args.model, results, loads, _versions(args.transformers_python))
    print(body)
    if args.write:
        write_section(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
