#!/usr/bin/env bash
# On the GPU machine, once its parts are in PARTS (q00, q01, ..., lx/, tok/ from prepare-sglang.sh):
# SGLang 0.5.17, its slimmed kernels, flashinfer and longctx into /tmp/site-sgl. Then, in each shell:
#   export PYTHONPATH=/tmp/site-sgl PATH=/tmp/site-sgl/bin:$PATH HF_HUB_OFFLINE=1
set -eu
PARTS=${1:?PARTS}
[ -f /tmp/site-sgl/.ready ] && exit 0
W=$(mktemp -d); cat "$PARTS"/q0* | tar -xzf - -C "$W"
# One pip call takes both folders: a package in both is named here, before pip's own refusal.
python3 "$(dirname "$0")"/bundle_wheels.py --check "$W" "$PARTS"/lx
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-sgl \
  "$W"/*.whl "$PARTS"/lx/*.whl
rm -rf "$W"; touch /tmp/site-sgl/.ready
