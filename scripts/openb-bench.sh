#!/usr/bin/env bash
# The FGD paper's packing experiment ("Beware of Fragmentation", ATC 2023) on
# one of Alibaba's openb pod lists, with the paper's protocol: seeds 42 to 51,
# every pod once plus copies up to 130 % of the cluster's GPUs, in a random
# order, each placed once or failed (`xp sim --place-once`). Prints, for each
# placement, the GPU allocation ratio in % as the arrived GPUs pass 90, 100
# and 130 % of the cluster's: the mean over the seeds, lowest and highest.
#
#   scripts/openb-bench.sh XP POD_LIST.csv NODE_LIST.csv [PLACEMENT...]
#
# XP is the `xp` binary (a release build: each run takes about a second);
# the CSV files are the paper's (`openb_pod_list_*.csv`, whose `gpu_spec`
# becomes the trace's `gpu_types`, and `openb_node_list_gpu_node.csv`);
# PLACEMENT defaults to `binpack fragmentation_aware`.
set -euo pipefail
. "$(dirname "$0")/openb-lib.sh"
xp=$1 pods=$2 nodes=$3
shift 3
placements=(binpack fragmentation_aware)
[ $# -eq 0 ] || placements=("$@")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...: one worker asking
# for num_gpu whole GPUs, or a share of one (gpu_milli thousandths).
awk -F, 'NR == 1 { print "job_id,submit_s,duration_s,num_workers,gpus_per_worker,cpu_milli_per_worker,mem_mib_per_worker,gpu_types"; next }
  { gpus = ($4 == 1) ? $5 / 1000 : $4; print $1 ",0,,1," gpus "," $2 "," $3 "," $6 }' "$pods" >"$work/trace.csv"
openb_cluster_csv "$nodes" "$work/nodes.csv"

for placement in "${placements[@]}"; do
  for seed in $(seq 42 51); do
    "$xp" sim --trace "$work/trace.csv" --cluster-csv "$work/nodes.csv" --place-once \
      --load 1.3 --seed "$seed" --placement "$placement" --json 2>/dev/null
    echo
  done | python3 -c '
import json, sys
runs = [json.loads(line) for line in sys.stdin if line.strip()]
cells = []
for load in ("0.9", "1.0", "1.3"):
    ratios = [run["alloc_ratio"][load] * 100 for run in runs]
    cells.append("%.2f (%.2f-%.2f)" % (sum(ratios) / len(ratios), min(ratios), max(ratios)))
print("%-20s" % sys.argv[1], " | ".join(cells))
' "$placement"
done
