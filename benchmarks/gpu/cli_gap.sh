#!/usr/bin/env bash
# `longctx batch` against the API in process on the GPU machine, in one device call, with what explains it.
# PARTS holds what prepare-wheels.sh made (or prepare-sglang.sh with ENGINE=sglang); OUT gets:
#   cli-inprocess.md      benchmarks/cli_inprocess.py's rows and paired gaps (ROUNDS rounds, default 12)
#   imp-cli-N.txt, imp-api-N.txt   `python -X importtime` of one `longctx batch` and one batch_one.py (3 each)
#   cli.prof, api.prof    a cProfile of each (python3 -m pstats to read)
#   env.txt               the interpreter, the site's size, the console script's first lines, the cores
# The two new processes differ only in their entry (the console script, benchmarks/batch_one.py), so the
# imports and profiles say what the CLI adds where the machine's environment differs from the 2-core one.
# Usage: benchmarks/gpu/cli_gap.sh PARTS OUT   (from the project's root; the checkout is what is measured)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; PORT=${PORT:-8765}; ROUNDS=${ROUNDS:-12}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
ENGINE=${ENGINE:-vllm}
if [ "$ENGINE" = sglang ]; then
    "$HERE"/install-sglang.sh "$PARTS"; SITE=/tmp/site-sgl; SERVE=serve-sglang.sh
else
    "$HERE"/install.sh "$PARTS"; SITE=/tmp/site; SERVE=serve.sh
fi
export PYTHONPATH=$REPO:$SITE PATH=$SITE/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
PID=""
if ! curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; then
    PID=$("$HERE"/$SERVE "$PARTS" "$PORT" 0.85 131072 | tail -1)
fi
trap '[ -n "$PID" ] && kill -TERM -- "-$PID" 2>/dev/null; cp /tmp/$ENGINE-$PORT.log "$OUT"/ 2>/dev/null || true' EXIT
URL=http://127.0.0.1:$PORT/v1
{
    python3 -c 'import sys; print(sys.version)'
    echo "entries in $SITE: $(ls "$SITE" | wc -l)"; echo "cores: $(nproc)"
    head -3 "$(command -v longctx)"
} > "$OUT"/env.txt
python3 "$REPO"/benchmarks/cli_inprocess.py --engines "$ENGINE" --base-url "$ENGINE=$URL" --rounds "$ROUNDS" \
    > "$OUT"/cli-inprocess.md 2> "$OUT"/cli-inprocess.err || echo "cli_inprocess.py failed: $OUT/cli-inprocess.err" >&2
# The same batch as the benchmark's: textwrap.py and its eight questions, a fresh store each run.
WORK=$(mktemp -d); mkdir "$WORK"/corpus
cp "$(python3 -c 'import textwrap; print(textwrap.__file__)')" "$WORK"/corpus/
python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import cli_inprocess; print("\n".join(cli_inprocess.QUESTIONS))' \
    "$REPO"/benchmarks > "$WORK"/questions.txt
CLI=("$(command -v longctx)" batch "$WORK"/corpus --questions "$WORK"/questions.txt --base-url "$URL" --max-tokens 2)
API=("$REPO"/benchmarks/batch_one.py "$WORK"/corpus "$WORK"/questions.txt "$URL" 2)
for n in 1 2 3; do
    LONGCTX_HOME=$WORK/cli-$n python3 -X importtime "${CLI[@]}" > /dev/null 2> "$OUT"/imp-cli-$n.txt
    LONGCTX_HOME=$WORK/api-$n python3 -X importtime "${API[@]}" > /dev/null 2> "$OUT"/imp-api-$n.txt
done
LONGCTX_HOME=$WORK/cli-prof python3 -m cProfile -o "$OUT"/cli.prof "${CLI[@]}" > /dev/null 2>&1
LONGCTX_HOME=$WORK/api-prof python3 -m cProfile -o "$OUT"/api.prof "${API[@]}" > /dev/null 2>&1
rm -rf "$WORK"
