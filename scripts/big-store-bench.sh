#!/usr/bin/env bash
# The HTTP API's paged listings and the dashboard's pages on a head holding
# many trials, kept in the embedded store and in PostgreSQL, one after the
# other in one run: the same requests as docs/measurements/http-and-dashboard.md
# (scripts/http-bench.py, 10 clients, 300 requests; scripts/dashboard-bench.py,
# each page 10 times), so the stores compare at sizes beyond its tables.
#
#     CARGO_TARGET_DIR=/tmp/target-bench cargo build --release -p xp-head -p xp
#     scripts/big-store-bench.sh /tmp/target-bench/release 10   # ten experiments of 100,000 waiting trials
#
# The trials wait (no node joins). PostgreSQL runs durable (fsync on), from a
# cluster made here with initdb.
set -euo pipefail
bin=${1:?the directory of release xp-head and xp}
experiments=${2:-1}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/xp-big-store-XXXXXX)
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
head_pid=
cleanup() {
  [ -n "$head_pid" ] && kill -9 "$head_pid" 2>/dev/null || true
  stop_bench_postgres
  rm -rf "$work"
}
trap cleanup EXIT

start_bench_postgres
prepare_heads

# measure NAME STORE_ARGS...: a head on that store, filled, then the listings.
measure() {
  local name=$1
  shift
  XP_LOG=warn "$bin/xp-head" start --listen 127.0.0.1:0 --data-dir "$work/heads/$name" \
    --http 127.0.0.1:18181 --policy "$work/policy.yaml" "$@" >"$work/heads/$name.out" 2>"$work/heads/$name.log" &
  head_pid=$!
  disown
  until grep -q '^admin: ' "$work/heads/$name.out"; do
    kill -0 "$head_pid" 2>/dev/null || { cat "$work/heads/$name.log" >&2; exit 1; }
    sleep 0.1
  done
  grep '^admin: ' "$work/heads/$name.out" | cut -c8- >"$work/$name.cred"
  local started first
  started=$(date +%s.%N)
  for experiment in $(seq "$experiments"); do
    printf 'name: big-%s\ntrial:\n  command: [echo, "{x} {y}"]\nsearch:\n  algorithm: grid\n  space: {x: {choice: [%s]}, y: {choice: [%s]}}\n' \
      "$experiment" "$(values 100)" "$(values 1000)" >"$work/grid.yaml"
    local id
    until id=$(XP_CLUSTER=$(cat "$work/$name.cred") "$bin/xp" submit "$work/grid.yaml"); do sleep 5; done
    first=${first:-$id}
  done
  echo "$name: $((experiments * 100000)) trials submitted in $(python3 -c "print(f'{$(date +%s.%N) - $started:.0f}')") s; RSS $(rss_mib "$head_pid") MiB"
  sleep 5
  local bench=(python3 "$here/http-bench.py" --http 127.0.0.1:18181 --pid "$head_pid" --secret-file "$work/$name.cred" --requests 300)
  echo "$name: trials, limit=100, 10 clients"
  "${bench[@]}" --path "/api/experiments/$first/trials?limit=100" --follow --concurrency 10 || true
  echo "$name: trials, limit=100, 1 client"
  "${bench[@]}" --path "/api/experiments/$first/trials?limit=100" --follow --concurrency 1 || true
  echo "$name: /api/experiments, 10 clients"
  "${bench[@]}" --path "/api/experiments" --concurrency 10 || true
  echo "$name: dashboard pages, the first experiment's"
  python3 "$here/dashboard-bench.py" --http 127.0.0.1:18181 --secret-file "$work/$name.cred" \
    --experiment "$first" --repeat 10 || true
  kill -9 "$head_pid"
  while kill -0 "$head_pid" 2>/dev/null; do sleep 0.1; done
  head_pid=
}

measure redb
measure postgres --store "$store"
