#!/usr/bin/env bash
# The SGLang GPU benchmark in two commands of at most BUDGET seconds each (a device call's limit),
# on a machine with one NVIDIA GPU and no network, PARTS from prepare-sglang.sh:
#   sglang-all.sh bench PARTS OUT [BUDGET=585] [SPEC=105000 ...]: install, the bench server
#       (serve-sglang.sh, window 131,072), then for each SPEC (CONTEXTS, or CONTEXTS:ROWS with ROWS
#       bench_gpu.py's --only, comma-separated) bench_gpu.py with every dispatch strategy, one run
#       of each row, no scenario started after the budget less a margin for the last one; writes
#       OUT/results-sglang-h200-N.json for the N-th SPEC. The server is stopped at the end.
#   sglang-all.sh jobs PARTS OUT [BUDGET=585]: four replicas at once (SGLang with --max-total-tokens
#       checks its memory fraction, so they can start together): two plain, two with HiCache
#       (--enable-hierarchical-cache --hicache-ratio 2), then jobs.sh on each pair; writes
#       OUT/jobs-sglang-h200.json, OUT/jobs-sglang-hicache-h200.json and their metrics-*.json.
# Both leave OUT/all-PHASE.log and OUT/logs-PHASE.tar.gz (the servers' logs).
# JOB_PACKS, JOB_TOKENS, JOB_BLOCKS (x16 = --max-total-tokens), REPETITIONS: the job's size.
set -u
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PHASE=${1:?bench or jobs}; PARTS=$(cd "${2:?PARTS}" && pwd); OUT=${3:?OUT}; BUDGET=${4:-585}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); T0=$SECONDS
left() { echo $((BUDGET - (SECONDS - T0))); }
stamp() { echo "[sglang-all $PHASE +$((SECONDS - T0)) s] $*"; }
exec > >(tee -a "$OUT/all-$PHASE.log") 2>&1
export ENGINE=sglang PYTHONPATH=$REPO:/tmp/site-sgl PATH=/tmp/site-sgl/bin:$PATH HF_HUB_OFFLINE=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PIDS=""
finish() {
    for p in $PIDS; do kill -TERM -- "-$p" 2>/dev/null; done
    sleep 2; for p in $PIDS; do kill -KILL -- "-$p" 2>/dev/null; done
    (cd /tmp && tar -czf "$OUT/logs-$PHASE.tar.gz" sglang-*.log sglang-serve-*.err 2>/dev/null)
    rm -f "$OUT"/sglang-*-*.log  # jobs.sh's copies: in the tar (at most 8 files come back)
    stamp "done"
}
trap finish EXIT
"$HERE"/install-sglang.sh "$PARTS" || { stamp "install failed"; exit 1; }
stamp "installed"
python3 -c "import sglang, sgl_kernel, flashinfer, transformers, tokenizers, torch; print('sglang', sglang.__version__, 'sgl_kernel', sgl_kernel.__version__, 'flashinfer', flashinfer.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'torch', torch.__version__)" \
  || { stamp "import failed"; exit 1; }

if [ "$PHASE" = bench ]; then
    shift 4 2>/dev/null || set --; [ $# -gt 0 ] || set -- 105000
    PID=$("$HERE"/serve-sglang.sh "$PARTS" 8765 0.85 131072 | tail -1) || { stamp "bench server failed"; exit 1; }
    PIDS="$PID"; stamp "bench server up (pid $PID)"
    curl -s http://127.0.0.1:8765/get_server_info > "$OUT/server-info-sglang-h200.json" || true
    N=0
    for SPEC in "$@"; do
        N=$((N + 1)); CONTEXTS=${SPEC%%:*}; ROWS=""; [ "$SPEC" != "$CONTEXTS" ] && ROWS=${SPEC#*:}
        # No scenario starts later than this; the longest (question-first) gets the margin.
        DEADLINE=$(( $(left) - ${LAST_SCENARIO_S:-90} ))
        [ "$DEADLINE" -gt 0 ] || { stamp "no time left for $SPEC"; break; }
        stamp "bench $SPEC: deadline ${DEADLINE} s"
        ONLY="$ROWS" BENCH_ARGS="--deadline $DEADLINE --repeats 1" PORT=8765 \
            "$HERE"/run.sh "$PARTS" "$OUT" "$CONTEXTS" 131072 sglang-h200-$N
        stamp "bench $SPEC finished"
    done
elif [ "$PHASE" = jobs ]; then
    PACKS=${JOB_PACKS:-8}; TOKENS=${JOB_TOKENS:-30000}; BLOCKS=${JOB_BLOCKS:-6144}
    KV=$((BLOCKS * 16)); COMMON="--max-total-tokens $KV --sleep-on-idle"
    STARTERS=""
    for p in 8771 8772 8773 8774; do
        EXTRA=$COMMON; [ $p -ge 8773 ] && EXTRA="$COMMON --enable-hierarchical-cache --hicache-ratio 2"
        (SGLANG_EXTRA_ARGS="$EXTRA" "$HERE"/serve-sglang.sh "$PARTS" $p 0.8 65536 > /tmp/sglang-pid-$p 2>/tmp/sglang-serve-$p.err) &
        STARTERS="$STARTERS $!"; sleep 3
    done
    # By PID: a bare `wait` also waits for the log's process substitution (tee), which never ends
    # (the first H200 run hung here with all four replicas up).
    wait $STARTERS
    for p in 8771 8772 8773 8774; do
        pid=$(tail -1 /tmp/sglang-pid-$p 2>/dev/null); [ -n "$pid" ] && PIDS="$PIDS $pid"
        cat /tmp/sglang-serve-$p.err
    done
    stamp "replicas up: $PIDS"
    REPETITIONS=${REPETITIONS:-1} PORTS="8771 8772" "$HERE"/jobs.sh "$PARTS" "$OUT" "$PACKS" "$TOKENS" "$BLOCKS" sglang-h200
    stamp "plain pair finished"
    if [ "$(left)" -gt 60 ]; then
        HICACHE=2 REPETITIONS=${REPETITIONS:-1} PORTS="8773 8774" \
            "$HERE"/jobs.sh "$PARTS" "$OUT" "$PACKS" "$TOKENS" "$BLOCKS" sglang-hicache-h200
        stamp "HiCache pair finished"
    else
        stamp "no time left for the HiCache pair"
    fi
fi
