#!/usr/bin/env bash
# Stop a process-runtime server by the PID its start script recorded: TERM its process group, wait up
# to GRACE seconds, then KILL. Prints one word: stopped | killed | absent. Only the recorded PID (and
# the process group it leads, created by setsid at start) is touched.
set -u
pidfile=$1
grace=${2:-15}
[ -f "$pidfile" ] || { echo absent; exit 0; }
pid=$(tr -dc '0-9' < "$pidfile")
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
  rm -f "$pidfile"; echo absent; exit 0
fi
kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
deadline=$(( $(date +%s) + grace ))
while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
if kill -0 "$pid" 2>/dev/null; then
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
  rm -f "$pidfile"; echo killed; exit 0
fi
rm -f "$pidfile"; echo stopped
