#!/usr/bin/env bash
# Prepare, on a machine with the package index, everything a GPU machine without network needs to run
# vLLM 0.24.0 and longctx: DEST/p00, p01, ... (vLLM, slimmed, tar.gz split in 44 MB parts), DEST/deps
# (vLLM's requirements the GPU image lacks), DEST/lx (longctx built from this checkout and its
# requirements), DEST/rt (vllm-router and what it needs), DEST/tok (the tiny model's tokenizer),
# DEST/lm and DEST/lmdeps (LMCache 0.5.3 and its requirements the image lacks: benchmarks/gpu/host-tiers.sh lmcache).
# Each folder or part stays under 64 MiB, so each can be moved on its own.
# Usage: benchmarks/gpu/prepare-wheels.sh DEST MODEL_DIR    (run from the project's root)
# vLLM 0.24.0 pins torch 2.11.0, the version the GPU image has (its wheel links libcudart.so.13).
set -eu
DEST=${1:?DEST}; MODEL=${2:?MODEL_DIR with tokenizer.json}
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
rm -rf "$DEST"; mkdir -p "$DEST"/deps "$DEST"/lx "$DEST"/rt "$DEST"/tok "$W"/whl "$W"/slim
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64
 --platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
 --platform manylinux1_x86_64 --platform any"
pip download -q --no-deps $PLAT -d "$W"/whl vllm==0.24.0
# Parts of the wheel a bf16/fp8 Llama on Hopper with Python 3.12 never loads.
(cd "$W"/slim && unzip -q "$W"/whl/vllm-0.24.0-*.whl && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so \
   vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-x86_64-linux-gnu.so)
tar -C "$W"/slim -cf - vllm vllm-0.24.0.dist-info | gzip -6 | split -b 44m -d - "$DEST"/p
pip download -q $PLAT -d "$DEST"/deps cachetools blake3 "fastapi[standard]<0.137,>=0.133" "starlette>=1.0.1" \
  "openai>=3.57,<4" "pydantic>=2.12" "prometheus-fastapi-instrumentator>=8.0.0" "lm-format-enforcer==0.11.3" \
  "llguidance>=1.7,<1.8" "outlines_core==0.2.14" "diskcache==5.6.3" "lark==1.2.2" partial-json-parser \
  "jsonschema>=4.23" "pyzmq>=25" msgspec "mistral_common>=1.11.3" "depyf==0.20.0" watchfiles python-json-logger \
  pybase64 cbor2 ijson setproctitle "openai-harmony>=0.0.3" "anthropic>=0.71" \
  "model-hosting-container-standards>=0.1.14,<1" mcp opentelemetry-sdk opentelemetry-api \
  opentelemetry-exporter-otlp opentelemetry-semantic-conventions-ai gguf
pip download -q --no-deps $PLAT -d "$DEST"/deps "xgrammar>=0.2.1,<1" "compressed-tensors==0.17.0" "apache-tvm-ffi==0.1.11"
# longctx from this checkout with its whole requirement tree, resolved by pip rather than listed by
# hand (a hand list missed httpx2's httpcore2 and truststore, and the GPU run failed to import longctx).
pip wheel -q --no-deps -w "$DEST"/lx .
pip download -q $PLAT -d "$DEST"/lx "$DEST"/lx/longctx*.whl
pip download -q --no-deps $PLAT -d "$DEST"/rt vllm-router orjson
"$HERE"/prepare-lmcache.sh "$DEST"
# Leave out what the GPU image already has, and a wheel an earlier folder already holds (install.sh
# installs the three folders in one pip call, which refuses two of one name; two versions stop here).
python3 "$HERE"/bundle_wheels.py "$HERE/image-packages.txt" --keep longctx "$DEST"/deps "$DEST"/lx "$DEST"/rt
cp "$MODEL"/tokenizer.json "$MODEL"/tokenizer_config.json "$MODEL"/chat_template.jinja "$DEST"/tok/ 2>/dev/null || cp "$MODEL"/tokenizer* "$DEST"/tok/
rm -rf "$W"; du -sh "$DEST"/*
