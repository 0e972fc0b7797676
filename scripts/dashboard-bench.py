#!/usr/bin/env python3
"""Measures how fast the head serves each dashboard page: the HTML and every
JSON request the page makes on its first load (its first poll), fetched one
after another as the page does, so a page's figure is the sum of its requests.
Each page is loaded REPEAT times after one warm-up; the median and p99 of the
page's total and the slowest request are printed.

    CARGO_TARGET_DIR=/tmp/target-rel nice -n 19 cargo build --release -p xp-head -p xp
    B=/tmp/target-rel/release
    $B/xp-head start --listen 127.0.0.1:0 --data-dir /tmp/dash --http 127.0.0.1:18082 > /tmp/dash.out &
    grep '^admin: ' /tmp/dash.out | cut -c8- > /tmp/dash.cred
    # grid.yaml: trial {command: [echo, '{x} {y}']}, search: grid over x and y,
    # 100 choices each (10,000 trials), metric: loss
    ID=$(XP_CLUSTER="$(cat /tmp/dash.cred)" $B/xp submit grid.yaml)
    scripts/dashboard-bench.py --http 127.0.0.1:18082 --secret-file /tmp/dash.cred \
        --experiment "$ID" --repeat 50

Only the standard library.
"""

import argparse
import http.client
import statistics
import time
import urllib.parse


def pages(experiment, metric):
    """Each page and the requests its first load makes, in pages.js's order."""
    q = urllib.parse.quote
    exp = "/api/experiments/" + q(experiment)
    trial = experiment + "-t0"
    return {
        "experiments": ["/", "/api/whoami", "/api/experiments?limit=1000", "/api/pipelines"],
        "experiment": [
            "/experiments/" + q(experiment),
            "/api/whoami",
            exp,
            exp + "/trials?limit=100&sort=id",
            exp + "/curves?metric=" + q(metric) + "&series=10&smoothing=0.6",
            exp + "/trials?limit=1000&sort=metric&state=succeeded,stopped,running",
            exp + "/replicates",
            "/api/report?experiment=" + q(experiment),
            "/api/alerts?experiment=" + q(experiment),
        ],
        "trial": [
            "/trials/" + q(trial),
            "/api/whoami",
            "/api/trials/" + q(trial),
            exp + "/curves?trials=" + q(trial) + "&metric=" + q(metric),
            "/api/trials/" + q(trial) + "/logs?rank=0&offset=0&max_bytes=262144",
            "/api/trials/" + q(trial) + "/telemetry",
            "/api/alerts?experiment=" + q(experiment),
        ],
        "queues": ["/queues", "/api/whoami", "/api/queues?limit=1000", "/api/waiting?limit=200"],
        "nodes": ["/nodes", "/api/whoami", "/api/nodes?limit=1000", "/api/gpus"],
        "cluster": ["/cluster", "/api/whoami", "/api/cluster?buckets=60", "/api/report?since=7d"],
    }


def fetch(connection, path, headers):
    """One request on a kept-alive connection: (status, seconds, bytes)."""
    start = time.perf_counter()
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    body = response.read()
    return response.status, time.perf_counter() - start, len(body)


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", required=True, help="HOST:PORT of the head's HTTP API")
    parser.add_argument("--secret-file", required=True, help="a file holding a user's credential")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--metric", default="loss")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--detail", action="store_true", help="also print each request's median")
    args = parser.parse_args()

    host, port = args.http.rsplit(":", 1)
    with open(args.secret_file) as secret:
        headers = {"Authorization": "Bearer " + secret.read().strip()}
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    print(f"{'page':<12} {'requests':>8} {'KiB':>8} {'median ms':>10} {'p99 ms':>8} {'slowest request (median ms)'}")
    for name, paths in pages(args.experiment, args.metric).items():
        totals, per_path, size, statuses = [], {path: [] for path in paths}, 0, {}
        for round_ in range(args.repeat + 1):
            total, size = 0.0, 0
            for path in paths:
                status, seconds, length = fetch(connection, path, headers)
                statuses[path] = status
                total += seconds
                size += length
                if round_ > 0:
                    per_path[path].append(seconds)
            if round_ > 0:
                totals.append(total)
        slowest = max(paths, key=lambda path: statistics.median(per_path[path]))
        print(
            f"{name:<12} {len(paths):>8} {size / 1024:>8.0f} {statistics.median(totals) * 1000:>10.1f} "
            f"{percentile(totals, 0.99) * 1000:>8.1f} {slowest} ({statistics.median(per_path[slowest]) * 1000:.1f})"
        )
        if args.detail:
            for path in paths:
                print(f"{'':<12} {statistics.median(per_path[path]) * 1000:>8.1f} ms  {path}")
        missing = [path for path, status in statuses.items() if status == 404]
        if missing:
            print(f"{'':<12} not served here (404): {', '.join(missing)}")


if __name__ == "__main__":
    main()
