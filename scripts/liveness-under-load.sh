#!/usr/bin/env bash
# No healthy node is judged lost under load (issue 27): a head with the
# default node timeout (3 s; heartbeats every 500 ms) and two nodes on this
# machine run for DURATION seconds (600 by default) while BUSY processes per
# core spin (2 by default) and the nodes run a stream of short command
# trials. At the end it prints how many times the head judged a node lost
# (0 is the goal), each node's state, and how many trials succeeded.
#
# Usage: scripts/liveness-under-load.sh [DURATION_S]   (binaries from target/debug,
# or XP_BIN_DIR; run `cargo build --bins` first)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-600}
busy_per_core=${BUSY:-2}
bin=${XP_BIN_DIR:-$PWD/target/debug}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

XP_LOG=info "$bin/xp-head" start --listen 127.0.0.1:0 --data-dir "$work/head" >"$work/head.out" 2>"$work/head.log" &
pids+=($!)
for _ in $(seq 100); do grep -q '^node: ' "$work/head.out" 2>/dev/null && break; sleep 0.1; done
admin=$(sed -n 's/^admin: //p' "$work/head.out")
node=$(sed -n 's/^node: //p' "$work/head.out")
for name in a b; do
  XP_JOIN="$node" XP_LOG=info "$bin/xp-node" join --data-dir "$work/node-$name" --cpus 2 --label "name=$name" 2>"$work/node-$name.log" &
  pids+=($!)
done

# Every core busy, then some.
for _ in $(seq $(( $(nproc) * busy_per_core ))); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done

export XP_CLUSTER="$admin"
cat >"$work/short.yaml" <<'EOF'
name: liveness-load
team: load
trial:
  command: [sh, -c, 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo "XP_METRIC {\"step\": 1, \"x\": {x}}"']
  resources: {cpu: 1}
search:
  algorithm: grid
  space:
    x: {int: [1, 400]}
EOF
"$bin/xp" submit "$work/short.yaml" >/dev/null
start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt "$duration" ]; do
  sleep 10
  # Keep trials coming: a new run of the sweep once the last one is done.
  if ! "$bin/xp" status --json 2>/dev/null | grep -q '"state":"running"'; then
    "$bin/xp" submit --rerun "$work/short.yaml" >/dev/null
  fi
done
echo "ran ${duration} s with $(( $(nproc) * busy_per_core )) spinning processes on $(nproc) cores"
echo "node losses judged by the head: $(grep -c 'node lost' "$work/head.log" || true)"
echo "head pauses excused: $(grep -c 'the head did not run for a while' "$work/head.log" || true)"
"$bin/xp" nodes
echo "trials succeeded: $("$bin/xp" status --json | grep -o '"state":"succeeded"' | wc -l)"
