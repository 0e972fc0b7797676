#!/usr/bin/env bash
# Measures how long a standby head takes to serve after `kill -9` of its leader
# on a PostgreSQL store holding many trials, warm (the standby followed the
# store while it waited) and cold (a head started after the lease ran out
# reads the whole store), in one run on one database. For docs/guide/postgres.md.
#
#     CARGO_TARGET_DIR=/tmp/target-bench cargo build --release -p xp-head -p xp
#     scripts/takeover-bench.sh /tmp/target-bench/release 100 1000 1    # 100 x 1,000 = 100,000 trials
#     scripts/takeover-bench.sh /tmp/target-bench/release 100 1000 10   # ten such experiments: 1,000,000
#
# The experiment's trials wait (no node joins), so the store holds them all
# and nothing else runs. It prints, for each head, the time from taking the
# lead to serving (the store read and the core rebuilt) and the head's RSS.
# PostgreSQL runs durable (fsync on), from a cluster made here with initdb.
set -euo pipefail
bin=${1:?the directory of release xp-head and xp}
rows=${2:-100}
columns=${3:-1000}
experiments=${4:-1}
work=$(mktemp -d /tmp/xp-takeover-XXXXXX)
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
trap bench_cleanup EXIT

start_bench_postgres
prepare_heads

# head NAME PORT PEER_PORT: starts xp-head NAME, logging to heads/NAME.log.
head() {
  XP_LOG=info "$bin/xp-head" start --listen "127.0.0.1:$2" --data-dir "$work/heads/$1" \
    --store "$store" --peer "127.0.0.1:$3" --policy "$work/policy.yaml" >"$work/heads/$1.out" 2>"$work/heads/$1.log" &
  pids+=($!)
  disown
}
# wait_for NAME TEXT: waits until head NAME logged TEXT.
wait_for() {
  until grep -q "$2" "$work/heads/$1.log"; do sleep 0.05; done
}
# lead_to_serve NAME: seconds from "this head leads the store" to "head started".
lead_to_serve() {
  python3 - "$work/heads/$1.log" <<'EOF'
import re, sys, datetime
times = {}
for line in open(sys.argv[1]):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    for key, text in (("lead", "this head leads the store"), ("serve", "head started")):
        if text in line and key not in times:
            times[key] = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
print(f"{(times['serve'] - times['lead']).total_seconds():.2f}")
EOF
}

head a 17701 17702
wait_for a "head started"
grep '^admin: ' "$work/heads/a.out" | cut -c8- >"$work/admin"
cat >"$work/grid.yaml" <<EOF
trial:
  command: [echo, '{x} {y}']
search:
  algorithm: grid
  space: {x: {choice: [$(values "$rows")]}, y: {choice: [$(values "$columns")]}}
EOF
started=$(date +%s.%N)
for experiment in $(seq "$experiments"); do
  (echo "name: takeover-bench-$experiment" && cat "$work/grid.yaml") >"$work/grid-$experiment.yaml"
  # A head busy with the last submission may keep a new client waiting past its timeout.
  until XP_CLUSTER=$(cat "$work/admin") "$bin/xp" submit "$work/grid-$experiment.yaml" >/dev/null; do sleep 5; done
  echo "  experiment $experiment at $(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')") s, leader RSS $(rss_mib "${pids[0]}") MiB"
done
echo "submitted $((rows * columns * experiments)) trials in $(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')") s"
leader_pid=${pids[0]}
echo "leader a: RSS $(rss_mib "$leader_pid") MiB"

head b 17702 17701
standby_pid=${pids[1]}
wait_for b "standing by warm"
echo "standby b: $(grep -o 'took_ms=[0-9]*' "$work/heads/b.log") for its first read of the store, RSS $(rss_mib "$standby_pid") MiB"
sleep 2
killed=$(date +%s.%N)
kill -9 "$leader_pid"
wait_for b "head started"
echo "warm: b serves $(python3 -c "print(f'{$(date +%s.%N) - $killed:.2f}')") s after the kill; from leading to serving $(lead_to_serve b) s; RSS $(rss_mib "$standby_pid") MiB"

kill -9 "$standby_pid"
sleep 6 # the lease runs out: the next head leads at once and reads the whole store
head c 17703 17701
wait_for c "head started"
echo "cold: c from leading to serving $(lead_to_serve c) s; RSS $(rss_mib "${pids[2]}") MiB"
