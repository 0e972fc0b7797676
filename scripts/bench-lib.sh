# Sourced by the measurement scripts on big stores (takeover-bench.sh,
# big-store-bench.sh, finished-store-bench.sh), which work in the directory
# $work: a throw-away PostgreSQL cluster there, made with initdb and run
# durable (fsync on) on a Unix socket, as the `postgres` user when root (after
# `start_bench_postgres`, `$store` is its address; the caller's cleanup calls
# `stop_bench_postgres`, or is `bench_cleanup`), the heads' directory and a
# policy that admits a million waiting trials.
pg_bin=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
as_postgres=()
if [ "$(id -u)" = 0 ]; then
  as_postgres=(runuser -u postgres --)
fi

start_bench_postgres() {
  [ "$(id -u)" = 0 ] && chown postgres "$work"
  "${as_postgres[@]}" "$pg_bin/initdb" -D "$work/pg" -U xp -A trust -E UTF8 --locale=C >/dev/null
  "${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
    -o "-c listen_addresses='' -c unix_socket_directories='$work' -c port=5432 -c max_wal_size=4GB" start >/dev/null
  store="postgres://xp@%2F${work//\//%2F}:5432/postgres"
}

stop_bench_postgres() {
  "${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
}

# Processes the caller started in the background; `bench_cleanup` (for
# `trap bench_cleanup EXIT`) kills them, stops PostgreSQL and removes $work.
pids=()
bench_cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  stop_bench_postgres
  rm -rf "$work"
}

# heads/ for the heads' data and logs, and policy.yaml: one experiment may
# hold every trial (above the default admission limits).
prepare_heads() {
  mkdir -p "$work/heads" && chmod 777 "$work/heads"
  echo 'admission: {max_pending_per_team: 2000000, max_submission_bytes: 1GiB, max_team_bytes: 4GiB}' >"$work/policy.yaml"
}
# values N: "0, 1, ..., N-1", a grid axis.
values() { python3 -c "print(', '.join(str(i) for i in range($1)))"; }
# rss_mib PID: its resident memory in MiB.
rss_mib() { echo $(($(awk '/VmRSS/ {print $2}' "/proc/$1/status") / 1024)); }
