#!/usr/bin/env bash
# Placement on a live GPU-sharing cluster, simulated: pods of one of Alibaba's
# openb pod lists (drawn with replacement, with their own run times capped at
# two hours) arrive as a Poisson stream offering LOAD times the cluster's GPUs,
# on the trace's 1,213 nodes, under the `default` policy; each placement is
# replayed with `xp sim` and reported by mean completion time, mean and p99
# queueing delay and GPU use while pods arrive. `fgd` scores against the mix
# the policy core observes (the last 4,096 pods), as a head would.
#
#   scripts/openb-dynamic-bench.sh XP POD_LIST.csv NODE_LIST.csv [LOAD] [SEEDS]
#
# LOAD defaults to 1.5, SEEDS to "1 2 3"; 50,000 pods per seed.
set -euo pipefail
. "$(dirname "$0")/openb-lib.sh"
xp=$1 pods=$2 nodes=$3 load=${4:-1.5} seeds=${5:-1 2 3}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
openb_cluster_csv "$nodes" "$work/nodes.csv"
gpus=$(awk -F, 'NR > 1 { sum += $2 } END { print sum }' "$work/nodes.csv")

for seed in $seeds; do
  python3 - "$pods" "$load" "$seed" "$gpus" "$work/trace.csv" <<'EOF'
import csv, random, sys
pods_file, load, seed, gpus, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = list(csv.DictReader(open(pods_file)))
rng = random.Random(seed)
pods = []
for _ in range(50_000):
    pod = rng.choice(rows)
    gpu = int(pod["gpu_milli"]) / 1000 if pod["num_gpu"] == "1" else int(pod["num_gpu"])
    duration = min(max(int(pod["deletion_time"]) - int(pod["creation_time"]), 1), 7200)
    pods.append((gpu, duration, pod))
rate = load * gpus / (sum(gpu * duration for gpu, duration, _ in pods) / len(pods))
writer = csv.writer(open(out, "w"))
writer.writerow(["job_id", "submit_s", "duration_s", "num_workers", "gpus_per_worker",
                 "cpu_milli_per_worker", "mem_mib_per_worker", "gpu_types"])
clock = 0.0
for number, (gpu, duration, pod) in enumerate(pods):
    clock += rng.expovariate(rate)
    writer.writerow([f"p{number}", int(clock), duration, 1, gpu, pod["cpu_milli"],
                     pod["memory_mib"], pod["gpu_spec"]])
EOF
  for placement in binpack fragmentation_aware fgd; do
    "$xp" sim --trace "$work/trace.csv" --cluster-csv "$work/nodes.csv" --policy default \
      --placement "$placement" --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("seed %s %-20s JCT %6.0f s, queueing %5.0f s (p99 %5.0f s), GPU use %.4f" % (
    sys.argv[1], sys.argv[2], r["jct_mean"], r["queue_delay_mean"], r["queue_delay_p99"],
    r["gpu_utilization_arrivals"]))' "$seed" "$placement"
  done
done
