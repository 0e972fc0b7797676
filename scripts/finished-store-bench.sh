#!/usr/bin/env bash
# A head's memory and restart time over a store of many finished trials, each
# with a metric history of ten points (issue 29's "a million finished trials").
#
#     CARGO_TARGET_DIR=/tmp/target-bench cargo build --release -p xp-head -p xp -p xp-node
#     scripts/finished-store-bench.sh /tmp/target-bench/release 10   # ten experiments of 100,000 trials
#
# Running a million trials takes hours here, so the store is made from real
# ones: a head on PostgreSQL runs one experiment of ten trials on a real node
# (each reports ten metric points and succeeds), and SQL then copies each of
# its experiment, trial, event and metric rows into experiments of 100,000
# trials (ids, indices, configurations and event numbers rewritten, the rest
# byte for byte). The grid's spec names 100,000 configurations, so every copy
# matches its experiment's spec. The store is then copied into the embedded
# store with `xp-head store copy`, and a head is started on each store in turn:
# the script prints how long it took to serve its first request, its RSS, and
# the latency of a paged listing of one experiment's trials, of one trial's
# metric history and of its detail (with its events, read from the store).
# KEEP=1 leaves the work directory (and its PostgreSQL) for more measurements.
# OBJECTIVES=2 makes the experiments multi-objective (`metric: [loss, accuracy]`),
# for the fronts of `xp status`.
set -euo pipefail
bin=${1:?the directory of release xp-head, xp-node and xp}
experiments=${2:-1}
work=$(mktemp -d /tmp/xp-finished-store-XXXXXX)
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
if [ -z "${KEEP:-}" ]; then trap bench_cleanup EXIT; fi

start_bench_postgres
prepare_heads
sql() { "${as_postgres[@]}" "$pg_bin/psql" -q -v ON_ERROR_STOP=1 "$store" "$@"; }

# head NAME STORE_ARGS...: starts xp-head NAME on 127.0.0.1:7811 in the
# background; $head_pid is its process.
head() {
  local name=$1
  shift
  XP_LOG=warn "$bin/xp-head" start --listen 127.0.0.1:7811 --data-dir "$work/heads/$name" \
    --http 127.0.0.1:18182 --policy "$work/policy.yaml" "$@" >"$work/heads/$name.out" 2>"$work/heads/$name.log" &
  head_pid=$!
  pids+=("$head_pid")
  disown
}

# The template: ten real trials, each reporting ten points.
metric=loss
if [ "${OBJECTIVES:-1}" = 2 ]; then metric=$'[loss, accuracy]\n  mode: [min, max]'; fi
head template --store "$store"
until [ -s "$work/heads/template/node.join" ] && grep -q '^admin: ' "$work/heads/template.out"; do sleep 0.1; done
chmod 600 "$work/heads/template/node.join"
XP_LOG=warn "$bin/xp-node" join --join-file "$work/heads/template/node.join" --data-dir "$work/node" \
  --gpus 4 >"$work/node.log" 2>&1 &
pids+=($!)
admin=$(grep '^admin: ' "$work/heads/template.out" | cut -c8-)
cat >"$work/template.yaml" <<EOF
name: finished
trial:
  command: [sh, -c, 'for s in 1 2 3 4 5 6 7 8 9 10; do echo "XP_METRIC {\"step\": \$s, \"loss\": 0.{x}\$s, \"accuracy\": 0.9\$s}"; done']
search:
  algorithm: grid
  metric: $metric
  space: {x: {choice: [$(values 10)]}}
EOF
XP_CLUSTER=$admin "$bin/xp" submit --wait "$work/template.yaml" >/dev/null
kill -9 "$head_pid"
wait "$head_pid" 2>/dev/null || true

# The copies: experiment n (digest 4096 + n) holds trials 0 to 99,999, trial i
# a copy of the template's trial i mod 10 with x = i; their events and metric
# rows are numbered after the template's, in trial order.
template=$(sql -At -c "select id from experiments")
digest=$(sql -At -c "select record->'id'->>'digest' from experiments")
started=$(date +%s)
sql <<EOF
create temp table ids as
  select c.n, 4096 + c.n as digest, lpad(to_hex(4096 + c.n), 16, '0') as id, i, i % 10 as t,
         (c.n - 1) * 100000 + i as k
  from generate_series(1, $experiments) as c(n), generate_series(0, 99999) as i;
create function pg_temp.rekey(body text, d ids) returns text language sql immutable as \$\$
  select replace(replace(replace(body, '"digest":$digest', '"digest":' || d.digest),
                         '"index":' || d.t || '}', '"index":' || d.i || '}'),
                 '\"x\":' || d.t || '}', '\"x\":' || d.i || '}') \$\$;
insert into experiments (id, record)
  select lpad(to_hex(4096 + n), 16, '0'),
         replace(replace(e.record::text, '"digest":$digest', '"digest":' || (4096 + n)),
                 '[0,1,2,3,4,5,6,7,8,9]',
                 '[' || (select string_agg(v::text, ',') from generate_series(0, 99999) as v) || ']')::json
  from generate_series(1, $experiments) as n, experiments as e where e.id = '$template';
insert into trials (id, record)
  select d.id || '-t' || d.i, pg_temp.rekey(o.record::text, d)::json
  from ids as d join trials as o on o.id = '$template-t' || d.t;
insert into events (seq, record)
  select 1000 + d.k * 5 + o.r, regexp_replace(pg_temp.rekey(o.body, d), '^\{"seq":[0-9]+', '{"seq":' || (1000 + d.k * 5 + o.r))::json
  from ids as d join (select (record->'trial'->>'index')::int as t, record::text as body,
                             row_number() over (partition by record->'trial'->>'index' order by seq) - 1 as r
                      from events) as o on o.t = d.t;
insert into metrics (trial, seq, record)
  select d.id || '-t' || d.i, 1000 + d.k * 10 + o.r, pg_temp.rekey(o.body, d)::json
  from ids as d join (select (record->'key'->'trial'->>'index')::int as t, record::text as body,
                             row_number() over (partition by trial order by seq) - 1 as r
                      from metrics) as o on o.t = d.t;
update xp_meta set value = (select max(seq) + 1 from metrics) where key = 'next_metric_seq';
EOF
echo "made in $(($(date +%s) - started)) s: $(sql -At -c 'select count(*) from trials') trials," \
  "$(sql -At -c 'select count(*) from events') events, $(sql -At -c 'select count(*) from metrics') metric rows"
sql -c "vacuum analyze"
kill -9 "${pids[1]}" 2>/dev/null || true
grep '^admin: ' "$work/heads/template.out" | cut -c8- >"$work/admin.cred"
first=$(printf '%016x' 4097)

# measure NAME STORE_ARGS...: a head on that store: the time from its start to
# its first answer, its RSS then, and paged listings of one experiment's trials
# and of one trial's history.
measure() {
  local name=$1 started
  shift
  started=$(date +%s.%N)
  head "$name" "$@"
  until curl -sf -o /dev/null -H "Authorization: Bearer $(cat "$work/admin.cred")" \
    "http://127.0.0.1:18182/api/experiments?limit=1"; do
    kill -0 "$head_pid" 2>/dev/null || { cat "$work/heads/$name.log" >&2; exit 1; }
    sleep 0.05
  done
  echo "$name: serving $(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')") s after its start; RSS $(rss_mib "$head_pid") MiB"
  sleep 5
  echo "$name: RSS $(rss_mib "$head_pid") MiB 5 s later"
  local bench=(python3 "$(dirname "$0")/http-bench.py" --http 127.0.0.1:18182 --pid "$head_pid"
    --secret-file "$work/admin.cred" --requests 300 --concurrency 10)
  echo "$name: trials, limit=100, 10 clients"
  "${bench[@]}" --path "/api/experiments/$first/trials?limit=100" --follow || true
  echo "$name: one trial's metric history, 10 clients"
  "${bench[@]}" --path "/api/trials/$first-t12345/metrics" || true
  echo "$name: one trial's detail with its events, 10 clients"
  "${bench[@]}" --path "/api/trials/$first-t12345" || true
  kill -9 "$head_pid"
  while kill -0 "$head_pid" 2>/dev/null; do sleep 0.1; done
}

measure postgres --store "$store"
mkdir -p "$work/heads/redb"
"$bin/xp-head" store copy "$store" "$work/heads/redb" | tail -1
measure redb
