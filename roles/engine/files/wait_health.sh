#!/usr/bin/env bash
# Wait for the head's /health, failing fast when the server is already gone.
# Usage: wait_health.sh URL TIMEOUT_S DELAY_S LIVENESS LOG [VERSION_URLS]
#   LIVENESS: pid:<pid> (process runtime), container:<name> (docker runtime) or - (not checked). It is
#   only probed (kill -0), never signalled.
#   LOG: the server log quoted when the server died (- = none; docker: `docker logs --tail`).
#   VERSION_URLS: space-separated URLs; the first that answers gives the engine's `"version"`.
# Prints `healthy after N s` (and `engine version: V`) and exits 0; otherwise prints one line saying
# why, then the end of the server's log, and exits 1 (dead) or 2 (timeout). Every request bypasses any
# proxy of the environment (--noproxy '*'): these are the harness's own servers.
# Why not poll with uri until the timeout: a server that
# refused its flags (e.g. a vLLM-only flag given to SGLang) exits within a second, and waiting out
# engine_start_timeout_s for it would hide the engine's own error message behind a generic timeout.
set -u
url=$1
timeout_s=$2
delay_s=$3
liveness=${4:--}
log=${5:--}
version_urls=${6:-}

alive() {
  case "$liveness" in
    pid:*)
      local pid=${liveness#pid:}
      [[ $pid =~ ^[1-9][0-9]*$ ]] && kill -0 "$pid" 2>/dev/null ;;
    container:*)
      [ "$(docker inspect -f '{{.State.Running}}' "${liveness#container:}" 2>/dev/null)" = true ] ;;
    *) true ;;
  esac
}

tail_log() {
  case "$liveness" in
    container:*) docker logs --tail 20 "${liveness#container:}" 2>&1 ;;
    *) [ "$log" != - ] && [ -f "$log" ] && tail -n 20 "$log" ;;
  esac
}

start=$(date +%s.%N)
while :; do
  if curl --noproxy '*' -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null; then
    echo "healthy after $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}') s"
    for v in $version_urls; do
      version=$(curl --noproxy '*' -fsS --max-time 5 "$v" 2>/dev/null | grep -o '"version" *: *"[^"]*"' | head -n 1 | sed 's/.*: *"\(.*\)"$/\1/')
      if [ -n "$version" ]; then echo "engine version: $version"; break; fi
    done
    exit 0
  fi
  if ! alive; then
    echo "the server exited before $url answered (${liveness}); last lines of its log:"
    tail_log
    exit 1
  fi
  if awk -v s="$start" -v e="$(date +%s.%N)" -v t="$timeout_s" 'BEGIN {exit !(e - s >= t)}'; then
    echo "no HTTP 200 from $url within engine_start_timeout_s=${timeout_s} s; last lines of the server log:"
    tail_log
    exit 2
  fi
  sleep "$delay_s"
done
