#!/usr/bin/env python3
"""Measures how a cold cluster report holds up the head's actor: one client
sends a cheap read through the actor (PROBE, by default the first experiment
of the listing) again and again as another user (each user's requests take
turns, `head/src/turns.rs`), while an admin asks for the whole cluster's
report (`GET /api/report`, an admin's) ROUNDS times, each with a window of
its own (`since`), so that each is computed afresh. It prints how long each
report took and the probe's latency (median, p99, max) while reports were
being computed and while none was. Every scheduling decision is taken on the
same actor as the probe's answer, so the probe's delay is what a decision
waits.

    # a kept store of a million finished trials: KEEP=1 scripts/finished-store-bench.sh ...
    $B/xp-head start --listen 127.0.0.1:7811 --data-dir $WORK/heads/redb \\
        --http 127.0.0.1:18182 --policy $WORK/policy.yaml &
    $B/xp-head user add --data-dir $WORK/heads/redb --team ops --role viewer prober | tail -1 > $WORK/prober.cred
    scripts/report-probe.py --http 127.0.0.1:18182 --secret-file $WORK/admin.cred \
        --probe-secret-file $WORK/prober.cred

Rounds are 12 s apart, past the head's budget for report computations (1 s
of every 10 s). `--heavy /api/cluster --gap 65` measures the cluster page's
first poll instead (its experiments' histories are kept for a minute after
the last poll), and `--heavy-command` a command instead of an HTTP request:
`--heavy-command "XP_CLUSTER=\$(cat $WORK/admin-redb.cred) $B/xp status --json EXP-t0" --gap 2`
measures a multi-objective experiment's status page from its first trial
(its front, which walks all its trials, and 5,000 trials), on a store of
`OBJECTIVES=2 KEEP=1 scripts/finished-store-bench.sh $B 1`. The embedded
store's head has a CA of its own: admin-redb.cred is admin.cred with its
`ca=` replaced by that of `$WORK/heads/redb/node.join`. Only the standard
library.
"""

import argparse
import http.client
import statistics
import subprocess
import threading
import time


def get(connection, path, secret):
    started = time.monotonic()
    connection.request("GET", path, headers={"Authorization": f"Bearer {secret}"})
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"{path}: HTTP {response.status}: {body[:300]!r}")
    return started, time.monotonic()


def summary(latencies):
    if not latencies:
        return "no probes"
    ms = sorted(1000 * latency for latency in latencies)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return (
        f"{len(ms)} probes: median {statistics.median(ms):.1f} ms, "
        f"p99 {p99:.1f} ms, max {ms[-1]:.1f} ms"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", required=True, help="the head's HTTP address")
    parser.add_argument("--secret-file", required=True, help="an admin's secret")
    parser.add_argument("--probe-secret-file", required=True, help="another user's secret")
    parser.add_argument("--probe", default="/api/experiments?limit=1")
    parser.add_argument(
        "--heavy",
        default="/api/report?since={}h",
        help="the heavy request; {} becomes a number of its own each round",
    )
    parser.add_argument("--heavy-command", help="a command to run instead of --heavy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap", type=float, default=12.0, help="seconds between reports")
    args = parser.parse_args()
    with open(args.secret_file) as file:
        secret = file.read().strip()
    with open(args.probe_secret_file) as file:
        probe_secret = file.read().strip()
    host, port = args.http.rsplit(":", 1)

    probes = []  # (start, end)
    stop = threading.Event()

    def probe():
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        while not stop.is_set():
            probes.append(get(connection, args.probe, probe_secret))
            time.sleep(0.005)

    prober = threading.Thread(target=probe)
    prober.start()
    reports = []  # (start, end)
    try:
        time.sleep(1.0)
        for round in range(args.rounds):
            if args.heavy_command:
                started = time.monotonic()
                subprocess.run(args.heavy_command, shell=True, check=True, stdout=subprocess.DEVNULL)
                reports.append((started, time.monotonic()))
            else:
                # A window of its own: a report kept from before does not answer it.
                path = args.heavy.format(1000 + round)
                # A connection of its own: the head closes idle ones.
                connection = http.client.HTTPConnection(host, int(port), timeout=120)
                reports.append(get(connection, path, secret))
            started, ended = reports[-1]
            print(f"report {round + 1}: {1000 * (ended - started):.0f} ms", flush=True)
            time.sleep(args.gap)
    finally:
        stop.set()
        prober.join()

    def during(start, end):
        return any(r_start <= end and start <= r_end for r_start, r_end in reports)

    busy = [end - start for start, end in probes if during(start, end)]
    idle = [end - start for start, end in probes if not during(start, end)]
    print(f"during the reports: {summary(busy)}")
    print(f"otherwise: {summary(idle)}")


if __name__ == "__main__":
    main()
