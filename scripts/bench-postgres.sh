# Sourced by the measurement scripts (takeover-bench.sh, big-store-bench.sh):
# a throw-away PostgreSQL cluster in the directory $work, made with initdb and
# run durable (fsync on) on a Unix socket there, as the `postgres` user when
# root. After `start_bench_postgres`, `$store` is its address; the caller's
# cleanup calls `stop_bench_postgres`.
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
