#!/usr/bin/env python3
"""Measures the head's HTTP API under concurrent clients: per-request latency
(median, p99) and the head's resident memory (VmRSS before, peak VmHWM during,
VmRSS after), for the README's numbers on paged trial listings.

Each of CONCURRENCY client threads repeatedly requests PATH (a path with a
query; with --follow it walks the listing by `next_cursor`, starting again at
the first page when it ends) until REQUESTS requests are done in all. Before the
burst the head's peak RSS is reset (writing 5 to /proc/PID/clear_refs, root
only), so VmHWM is the peak of the burst alone.

    CARGO_TARGET_DIR=/tmp/target-bench cargo build --release -p xp-head -p xp
    B=/tmp/target-bench/release
    $B/xp-head start --listen 127.0.0.1:0 --data-dir /tmp/h --http 127.0.0.1:18081 > /tmp/h.out &
    grep '^admin: ' /tmp/h.out | cut -c8- > /tmp/h.cred
    # grid.yaml: trial {command: [echo, '{x} {y}']}, search: grid over x (100
    # choices) and y (100 or 1,000 choices), metric: loss
    ID=$(XP_CLUSTER="$(cat /tmp/h.cred)" $B/xp submit grid.yaml)
    scripts/http-bench.py --http 127.0.0.1:18081 --pid $(pgrep -n xp-head) \
        --secret-file /tmp/h.cred --path "/api/experiments/$ID/trials?limit=100" \
        --follow --concurrency 10 --requests 300

Only the standard library; the clients read each answer whole and do not parse
it unless --follow needs the cursor.
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", required=True, help="HOST:PORT of the head's HTTP API")
    parser.add_argument("--pid", type=int, required=True, help="the head's process id")
    parser.add_argument("--path", required=True)
    parser.add_argument(
        "--secret-file",
        help="a file holding a user's credential (or secret), sent as the bearer token",
    )
    parser.add_argument("--follow", action="store_true", help="walk the listing by next_cursor")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    host, port = args.http.rsplit(":", 1)
    headers = {}
    if args.secret_file:
        with open(args.secret_file) as file:
            credential = file.read().strip()
        # The token of a credential string `xp://HOST:PORT?token=SECRET&ca=...`.
        query = urllib.parse.urlparse(credential).query
        secret = urllib.parse.parse_qs(query).get("token", [credential])[0]
        headers["Authorization"] = f"Bearer {secret}"
    latencies = []
    sizes = []
    lock = threading.Lock()
    remaining = [args.requests]
    errors = []

    def client():
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        cursor = None
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            path = args.path
            if cursor is not None:
                path += "&cursor=" + urllib.parse.quote(cursor, safe="")
            started = time.perf_counter()
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            body = response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                errors.append(f"{response.status} {body[:200]!r}")
                return
            if args.follow:
                cursor = json.loads(body).get("next_cursor")
            with lock:
                latencies.append(elapsed)
                sizes.append(len(body))

    try:
        with open(f"/proc/{args.pid}/clear_refs", "w") as clear:
            clear.write("5")
    except OSError as error:
        print(f"cannot reset the peak RSS ({error}); VmHWM includes earlier peaks")
    before = status_kib(args.pid, "VmRSS")
    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    after = status_kib(args.pid, "VmRSS")
    peak = status_kib(args.pid, "VmHWM")
    if errors:
        raise SystemExit(f"{len(errors)} failed requests, first: {errors[0]}")
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"{len(latencies)} requests, {args.concurrency} at a time, {wall:.2f}s: "
        f"median {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms; answer {statistics.median(sizes) / 1024:.0f} KiB median; "
        f"RSS {before / 1024:.0f} MiB before, peak {peak / 1024:.0f} MiB, {after / 1024:.0f} MiB after"
    )


if __name__ == "__main__":
    main()
