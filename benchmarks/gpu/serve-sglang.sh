#!/usr/bin/env bash
# On the GPU machine after install-sglang.sh: an SGLang 0.5.17 server for the same 8B-shaped Llama as
# serve.sh (32 layers, 8 KV heads of 128, random weights: --load-format dummy, nothing to download)
# with the tiny model's tokenizer and the seed's three switches: fp8 KV cache (fp8_e4m3), the radix
# cache (on unless disabled), chunked prefill of 8192-token steps. Prints the server's PID when ready.
# Usage: serve-sglang.sh PARTS PORT [MEM_FRACTION_STATIC=0.85] [CONTEXT_LENGTH=131072]
# SGLANG_EXTRA_ARGS: more flags (e.g. --max-total-tokens N for a replica with a small KV cache,
# --enable-hierarchical-cache for HiCache).
# MODEL_DIR: serve that model folder's own weights in bf16 instead (a real model: quality.sh), with the
# KV cache in KV_DTYPE (fp8_e4m3 by default; auto keeps the model's bf16).
# Why these: --attention-backend triton because the FA3 default needs sgl_kernel's flash_ops, which
# the slimmed kernel leaves out (1.1 GB), and flashinfer's attention compiles its kernels at first use;
# --sampling-backend pytorch so flashinfer's sampling kernels are not compiled either;
# --disable-cuda-graph as serve.sh's --enforce-eager (no capture at start); --enable-cache-report for
# usage.prompt_tokens_details.cached_tokens; --enable-metrics for longctx's counters. SGLang's own
# JIT kernels (rmsnorm, silu_and_mul, KV store) are compiled by nvcc at the first start and kept in
# TVM_FFI_CACHE_DIR, so a second server on the same machine starts without compiling.
set -eu
PARTS=${1:?PARTS}; PORT=${2:?PORT}; FRAC=${3:-0.85}; LEN=${4:-131072}
export PYTHONPATH=/tmp/site-sgl PATH=/tmp/site-sgl/bin:$PATH HF_HUB_OFFLINE=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/tvm-ffi-cache}
[ -d /usr/local/cuda/bin ] && export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=$PATH:/usr/local/cuda/bin
# Written to a new folder and renamed into place: replicas started together must not read a half file.
# SHAPE=1b: a Llama-3.2-1B shape (16 layers, 8 KV heads of 64: 16 KiB of fp8 KV a token), whose KV
# holds a million tokens on 80 GB where the 8B shape's 64 KiB a token does not.
if [ "${SHAPE:-8b}" = 1b ]; then
  SHAPE_FIELDS='"hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"max_position_embeddings":1310720'
else
  SHAPE_FIELDS='"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"max_position_embeddings":262144'
fi
if [ -n "${MODEL_DIR:-}" ]; then
  M=$MODEL_DIR; WEIGHTS="--dtype bfloat16"
else
  M=/tmp/llama${SHAPE:-8b}-shape; T=$(mktemp -d); cp "$PARTS"/tok/* $T/; WEIGHTS="--load-format dummy"
  cat > $T/config.json <<J
{"architectures":["LlamaForCausalLM"],"model_type":"llama",$SHAPE_FIELDS,"vocab_size":4096,
 "rope_theta":500000.0,"rms_norm_eps":1e-5,"torch_dtype":"bfloat16",
 "tie_word_embeddings":false,"bos_token_id":0,"eos_token_id":2}
J
  if [ -d $M ]; then rm -rf $T; else mv -T $T $M 2>/dev/null || rm -rf $T; fi
fi
setsid python3 -m sglang.launch_server --model-path $M --served-model-name m $WEIGHTS \
  --context-length "$LEN" --kv-cache-dtype "${KV_DTYPE:-fp8_e4m3}" --chunked-prefill-size 8192 \
  --attention-backend triton --sampling-backend pytorch --disable-cuda-graph \
  --enable-cache-report --enable-metrics --mem-fraction-static "$FRAC" --random-seed 0 \
  --host 127.0.0.1 --port "$PORT" ${SGLANG_EXTRA_ARGS:-} > /tmp/sglang-$PORT.log 2>&1 < /dev/null &
PID=$!
# Ready once its warm-up request is through (the HTTP port answers before that).
for _ in $(seq 1 200); do
    grep -q "ready to roll" /tmp/sglang-$PORT.log && curl -sf http://127.0.0.1:$PORT/v1/models >/dev/null && break
    kill -0 $PID 2>/dev/null || break
    sleep 2
done
curl -sf http://127.0.0.1:$PORT/v1/models >/dev/null || { tail -40 /tmp/sglang-$PORT.log >&2; exit 1; }
grep -E "max_total_num_tokens|KV Cache is allocated|Memory pool end|page_size" /tmp/sglang-$PORT.log | tail -4 >&2
echo $PID
