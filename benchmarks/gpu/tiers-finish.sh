# The end of host-tiers.sh (its EXIT trap), apart so that a test can run it with curl failing.
# Every step is tolerant: the script runs under `set -eu`, and a failed step (curl exits 7 where no
# LMCache server runs, as for the native and none variants) must not skip the rest. The server is
# stopped whatever came before; the script's own exit status is kept.
# Reads OUT, VARIANT, PORT, PIDS (process-group leaders, started with setsid) and, optionally,
# LOG_DIR (where the server logs are, default /tmp).
tiers_finish() {
  local status=$? pid
  set +e
  # The engine's counters while it still runs (an empty file says none were read).
  curl -sf -m 20 "http://127.0.0.1:$PORT/metrics" 2>/dev/null \
    | grep -E "^vllm:(kv_offload|prompt_tokens_by_source|prompt_tokens_cached_by_source|external_prefix|prefix_cache_hits)" \
    > "$OUT/tiers-$VARIANT-metrics.txt"
  if [ "$VARIANT" = lmcache ]; then
    curl -sf -m 20 http://127.0.0.1:8080/metrics > "$OUT/lmcache-metrics-end.txt" 2>/dev/null
  fi
  for pid in ${PIDS:-}; do kill -TERM -- "-$pid" 2>/dev/null; done
  for _ in $(seq 30); do
    local alive=""
    for pid in ${PIDS:-}; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 1
  done
  for pid in ${PIDS:-}; do kill -KILL -- "-$pid" 2>/dev/null; done
  cp "${LOG_DIR:-/tmp}/vllm-$PORT.log" "$OUT/vllm-tiers-$VARIANT.log" 2>/dev/null
  [ "$VARIANT" = lmcache ] && cp "${LOG_DIR:-/tmp}/lmcache-server.log" "$OUT"/ 2>/dev/null
  return "$status"
}
