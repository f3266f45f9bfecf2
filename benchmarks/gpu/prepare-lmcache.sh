#!/usr/bin/env bash
# Add to DEST (a folder prepare-wheels.sh made) DEST/lm: LMCache 0.5.3 (15 MB wheel, CUDA 13 build), and
# DEST/lmdeps: its requirements the GPU image lacks (about 16 MB; torch and what the image has left out).
# The wheel leaves torch unpinned, but its compiled ops link against the torch it was built with: checked
# here with nm against torch 2.11.0's exported symbols (the GPU image's, which vLLM 0.24.0 pins), 0.5.3 is
# the newest whose ops resolve; 0.5.4, 0.5.5 and 0.5.6 call
# c10::NotImplementedError(c10::SourceLocation, std::string), which 2.11.0 does not export, so importing
# lmcache.cuda_ops fails there. host-tiers.sh still checks the import before it starts anything.
# Usage: benchmarks/gpu/prepare-lmcache.sh DEST    (on a machine with the package index)
set -eu
DEST=${1:?DEST}; HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$DEST"/lm "$DEST"/lmdeps; mkdir -p "$DEST"/lm "$DEST"/lmdeps
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64
 --platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
 --platform manylinux1_x86_64 --platform any"
pip download -q --no-deps $PLAT -d "$DEST"/lm lmcache==0.5.3
pip download -q $PLAT -d "$DEST"/lmdeps aiofile awscrt cufile-python nvtx redis setuptools_scm google-api-core \
  google-cloud-bigtable "opentelemetry-exporter-prometheus<=0.61b0,>=0.50b0" "grpcio-observability==1.78.0" \
  "grpcio>=1.78.0" "protobuf<7,>=6.31.1" "numpy<=2.2.6"
python3 - "$HERE/image-packages.txt" "$DEST"/lmdeps <<'PY'
import os, re, sys
have = {l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")}
for d in sys.argv[2:]:
    for f in os.listdir(d):
        if re.split(r"-\d", f)[0].lower().replace("_", "-") in have:
            os.remove(os.path.join(d, f))
PY
du -sh "$DEST"/lm "$DEST"/lmdeps
