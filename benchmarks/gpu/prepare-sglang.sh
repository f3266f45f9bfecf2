#!/usr/bin/env bash
# Prepare, on a machine with the package index, what a GPU machine without network needs to run
# SGLang 0.5.17 and longctx: DEST/q00, q01, ... (one tar.gz of wheels split in 44 MB parts: SGLang,
# sglang-kernel slimmed, flashinfer, transformers/tokenizers at the versions SGLang pins, and the
# requirements the GPU image lacks), DEST/lx (longctx and its requirements), DEST/tok (the tiny
# model's tokenizer). Each part stays under 64 MiB, so each can be moved on its own.
# Usage: benchmarks/gpu/prepare-sglang.sh DEST MODEL_DIR    (run from the project's root)
#
# SGLang 0.5.17 is the newest release that pins torch==2.11.0, the GPU image's torch (0.5.20 pins
# 2.13.0, 0.5.23 2.14.1). Its wheel's requirements also name the kernel packages of other models
# and backends (flash-attn-4, helion, humming-kernels, nvidia-cutlass-dsl, tilelang, tokenspeed_mla,
# sgl-deep-gemm, quack-kernels, torchao, torchcodec, ...): installed --no-deps, a bf16/fp8 Llama with
# the triton attention backend imports none of them. The image's transformers 5.17.0 clashes with
# SGLang's own config classes ("'qwen3_asr' is already used by a Transformers config"), so its pin
# 5.12.1 travels, with tokenizers 0.22.2 (5.12.1 wants <=0.23.0; the image has 0.23.2).
set -eu
DEST=${1:?DEST}; MODEL=${2:?MODEL_DIR with tokenizer.json}
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
rm -rf "$DEST"; mkdir -p "$DEST"/lx "$DEST"/tok "$W"/whl
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64
 --platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
 --platform manylinux1_x86_64 --platform any"
pip download -q --no-deps $PLAT -d "$W"/whl sglang==0.5.17 sglang-kernel==0.4.5 flashinfer_python==0.6.15.post1 \
  transformers==5.12.1 tokenizers==0.22.2 apache-tvm-ffi==0.1.11 xgrammar==0.2.1 compressed-tensors==0.17.0
# Wheels rewritten without what a bf16/fp8 Llama on Hopper never loads (their RECORD rows go too):
# sglang-kernel's FA3 (flash_ops, 1.1 GB, only for --attention-backend fa3; sgl_kernel imports it
# lazily), FlashMLA and InfLLM (MLA / sparse models) and its sm100 build (Blackwell), keeping the sm90
# common_ops; xgrammar's static library (libxgrammar.a, for building against it, never imported).
python3 - "$W"/whl <<'PY'
import glob, os, re, sys, zipfile
drop = {
    "sglang_kernel-": r"sgl_kernel/(flash_ops\.|flashmla_ops\.|infllm_ops\.|sm100/)",
    "xgrammar-": r"xgrammar/lib/.*\.a$",
}
for prefix, pattern in drop.items():
    (path,) = glob.glob(os.path.join(sys.argv[1], prefix + "*.whl"))
    slim = path + ".slim"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
        for item in src.infolist():
            if re.match(pattern, item.filename):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(r for r in rows if not re.match(pattern, r.split(",")[0])).encode()
            out.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED)
    os.replace(slim, path)
PY
# SGLang's pure-Python requirements that its server imports for a text model (found by importing
# sglang.launch_server, the scheduler, the model runner, llama, the triton backend and HiRadixCache),
# with their own requirements; what the image has is dropped below.
pip download -q $PLAT -d "$W"/whl IPython msgspec orjson pybase64 python-multipart "pyzmq>=25.1.2" setproctitle \
  uvicorn fastapi watchfiles pydantic "openai==2.6.1" partial_json_parser "mistral_common>=1.11.5" \
  "soundfile==0.13.1" zstandard distro loguru interegular opentelemetry-api gguf dill
# longctx from this checkout with its whole requirement tree (httpx2 needs httpcore2 and truststore).
pip wheel -q --no-deps -w "$DEST"/lx .
pip download -q $PLAT -d "$DEST"/lx "$DEST"/lx/longctx*.whl
# Leave out what the GPU image already has (longctx, and what travels at a pinned version, stay), and
# from lx/ a wheel the SGLang bundle already holds: install-sglang.sh installs both in one pip call,
# which refuses two of one name (jsonschema, referencing, rpds_py ... came in both); two versions stop here.
python3 "$HERE"/bundle_wheels.py "$HERE/image-packages.txt" --keep longctx --keep transformers- --keep tokenizers- \
  "$W"/whl "$DEST"/lx
tar -C "$W"/whl -cf - . | gzip -6 | split -b 44m -d - "$DEST"/q
cp "$MODEL"/tokenizer.json "$MODEL"/tokenizer_config.json "$MODEL"/chat_template.jinja "$DEST"/tok/ 2>/dev/null || cp "$MODEL"/tokenizer* "$DEST"/tok/
ls "$W"/whl > "$DEST"/q-contents.txt
rm -rf "$W"; du -sh "$DEST"/*
