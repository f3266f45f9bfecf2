#!/usr/bin/env bash
# On the GPU machine: cached follow-ups as text and as token ids (followup_probe.py), and the answers an
# application uses (answers_probe.py: a streamed follow-up's first piece, typed batches), on one engine.
# Usage: followups.sh PARTS OUT ENGINE STEP
#   ENGINE: vllm (PARTS from prepare-wheels.sh) or sglang (PARTS from prepare-sglang.sh)
#   STEP:   probe (install, serve unless one answers on PORT, followup_probe at PACKS) |
#           api (followup_probe's ask_many and job rows at 100k, answers_probe at 100k) |
#           batch (bench_gpu's api batch, cli batch and api batch new process at 100k, 3 rounds; then one
#           cli batch under cProfile) |
#           stop (stop the server this script started)
# LEN: the window (vLLM 480000, SGLang 131072 by default); PACKS: followup_probe's --packs;
# VLLM_EXTRA_ARGS / SGLANG_EXTRA_ARGS reach the serve scripts; LABEL names the server's options.
# The server runs on (setsid) between the calls of one warm machine; its PID is kept in /tmp/followups.pid.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; ENGINE=${3:?ENGINE}; STEP=${4:?STEP}
PORT=${PORT:-8765}; LABEL=${LABEL:-default}; mkdir -p "$OUT"
if [ "$ENGINE" = sglang ]; then
    LEN=${LEN:-131072}; SITE=/tmp/site-sgl; "$HERE"/install-sglang.sh "$PARTS"
else
    LEN=${LEN:-480000}; SITE=/tmp/site; "$HERE"/install.sh "$PARTS"
    # The 8B shape's config says 262,144 positions; a longer window is what the probe measures.
    export VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
fi
export PYTHONPATH=$REPO:$SITE PATH=$SITE/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
URL=http://127.0.0.1:$PORT/v1
case "$STEP" in
stop)
    [ -f /tmp/followups.pid ] && kill -TERM -- "-$(cat /tmp/followups.pid)" 2>/dev/null || true
    rm -f /tmp/followups.pid; cp /tmp/"$ENGINE"-"$PORT".log "$OUT"/ 2>/dev/null || true; exit 0 ;;
probe)
    if ! curl -sf "$URL/models" >/dev/null; then
        if [ "$ENGINE" = sglang ]; then
            "$HERE"/serve-sglang.sh "$PARTS" "$PORT" 0.85 "$LEN" | tail -1 > /tmp/followups.pid
        else
            "$HERE"/serve.sh "$PARTS" "$PORT" 0.85 "$LEN" | tail -1 > /tmp/followups.pid
        fi
    fi
    python3 "$HERE"/followup_probe.py --base-url "$URL" --packs "${PACKS:-32000,122000,max}" \
        --modes "${MODES:-text,ids}" --server-label "$LABEL" --out "$OUT/followups-$ENGINE-$LABEL.json" ;;
api)
    python3 "$HERE"/answers_probe.py --base-url "$URL" --pack 100000 --ban-whitespace "$PARTS/tok/tokenizer.json" \
        --out "$OUT/answers-$ENGINE.json"
    python3 "$HERE"/followup_probe.py --base-url "$URL" --packs 100000 --follow-ups 1 --api-rows \
        --server-label "$LABEL" --out "$OUT/api-$ENGINE.json" ;;
batch)
    python3 "$HERE"/bench_gpu.py --base-url "$URL" --contexts 100000 --repeats 3 --only "api batch,cli batch,api batch new process" \
        --label "$ENGINE-batch" --out "$OUT/batch"
    mkdir -p "$OUT/profiles"
    BENCH_CLI_PROFILES=$OUT/profiles python3 "$HERE"/bench_gpu.py --base-url "$URL" --contexts 100000 \
        --repeats 1 --only "cli batch" --label "$ENGINE-profiled" --out "$OUT/batch" ;;
*) echo "unknown step $STEP" >&2; exit 2 ;;
esac
