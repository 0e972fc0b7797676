#!/usr/bin/env bash
# End-to-end test of xp on real Slurm (Debian's slurmctld and slurmd, with munge)
# on 127.0.0.1, run by scripts/test.sh (the README's test command, which .ci/run calls):
#   1. `sbatch examples/slurm/cluster.sbatch`: a head and a node inside one job
#      run a sweep to its end; every trial ran on the job's node, which offered
#      the job's GPUs (two stand-in GRES GPUs), CPUs and memory.
#   2. A head outside Slurm, and a node joining it from an array job
#      (`examples/slurm/join.sbatch`); a long trial runs there and checkpoints;
#      `scancel` of the job drains its node: the trial checkpoints and is
#      requeued without a retry (it has none); a second job's node joins and the
#      trial finishes there, resuming from the checkpoint taken at the drain,
#      which it reads from the backup directory; its worker gets GPU 1, the one
#      Slurm granted that job (another job holds GPU 0).
# The daemons run from a temporary directory and are stopped on exit, whatever
# happens; every wait has a deadline. Skips, saying why, where it cannot run
# (not root, or Slurm absent and not installable).
# Usage: scripts/slurm-e2e.sh  (XP_TARGET_DIR: where the debug binaries are;
# XP_SLURM_E2E_KEEP=1 keeps the temporary directory with every log)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

skip() {
  # Where CI runs (CI set, as .ci/run sets it), what cannot run is a failure.
  if [ -n "${CI:-}" ]; then
    echo "slurm-e2e: FAILED: cannot run in CI: $*" >&2
    exit 1
  fi
  echo "slurm-e2e: skipped: $*"
  exit 0
}
fail() {
  echo "slurm-e2e: FAILED: $*" >&2
  exit 1
}
log() { echo "[slurm-e2e $(date -u +%H:%M:%S)] $*"; }

[ "$(id -u)" = 0 ] || skip "needs root (it runs slurmctld, slurmd and munged)"
[ "$(uname -s)" = Linux ] || skip "needs Linux"

# Install what is missing (CI runs as root on a fresh Debian machine).
missing=()
for tool in slurmctld:slurmctld slurmd:slurmd munged:munge sbatch:slurm-client jq:jq python3:python3; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null || skip "missing ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]}"
  # Debian's maintainer scripts must not start the daemons: this test starts its own.
  policy=/usr/sbin/policy-rc.d
  had_policy=0
  [ -e "$policy" ] && had_policy=1
  [ "$had_policy" = 1 ] || printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null) ||
    { [ "$had_policy" = 1 ] || rm -f "$policy"; skip "cannot install ${missing[*]}"; }
  [ "$had_policy" = 1 ] || rm -f "$policy"
fi

target=${XP_TARGET_DIR:-$repo/target/debug}
for binary in xp xp-head xp-node; do
  if [ ! -x "$target/$binary" ]; then
    log "building the binaries"
    cargo build --locked -p xp -p xp-head -p xp-node --bins
    break
  fi
done

work=$(mktemp -d /tmp/xp-slurm-e2e.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  status=$?
  set +e
  if [ -n "${SLURM_CONF:-}" ] && [ -e "$SLURM_CONF" ]; then
    for job in $(squeue -h -o %A 2>/dev/null); do scancel "$job" 2>/dev/null; done
    # The jobs' nodes drain within their --drain-timeout (20 s).
    for _ in $(seq 300); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  # Stop in reverse order of start, each by its own process id.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  # What the jobs started and Slurm lost track of (proctrack/linuxproc follows
  # parents, so a process whose parent died escapes it): each process whose
  # command line names this test's directory, by its id.
  for cmdline in /proc/[0-9]*/cmdline; do
    pid=${cmdline#/proc/}
    pid=${pid%/cmdline}
    [ "$pid" = $$ ] && continue
    if tr '\0' ' ' 2>/dev/null <"$cmdline" | grep -qF "$work"; then
      echo "slurm-e2e: stopping leftover process $pid: $(tr '\0' ' ' 2>/dev/null <"$cmdline")"
      kill -KILL "$pid" 2>/dev/null
    fi
  done
  if [ "$status" != 0 ]; then
    for file in "$work"/*.log "$work"/logs/*; do
      [ -f "$file" ] || continue
      echo "---- $file (last 40 lines)"
      tail -n 40 "$file"
    done
  fi
  if [ -n "${XP_SLURM_E2E_KEEP:-}" ]; then
    echo "slurm-e2e: kept $work"
  else
    rm -rf "$work"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
  local deadline=$(($(date +%s) + $1))
  shift
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# A free TCP and UDP port (the head listens on UDP; Slurm on TCP).
free_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 20000))
    if ! (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && ! grep -qi ":$(printf '%04X' "$port") " /proc/net/udp /proc/net/udp6 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  fail "no free port"
}

# --- munge, with a key of its own -------------------------------------------
mkdir -p "$work/munge" "$work/logs"
chmod 755 "$work/munge"
head -c 1024 /dev/urandom >"$work/munge/munge.key"
chmod 400 "$work/munge/munge.key"
socket=$work/munge/munge.socket
munged --force --foreground --key-file="$work/munge/munge.key" --socket="$socket" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge.log" \
  --seed-file="$work/munge/munged.seed" >"$work/logs/munged.out" 2>&1 &
pids+=($!)
wait_for 20 sh -c "munge -n -S '$socket' | unmunge -S '$socket' >/dev/null 2>&1" ||
  fail "munged did not answer within 20 s"

# --- Slurm on this machine --------------------------------------------------
host=$(hostname -s)
# The machine as slurmd sees it (CPUs, memory), so the node is not refused as
# smaller than configured.
hardware=$(slurmd -C | head -n 1)
cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hardware")
memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hardware")
if [ -z "$cpus" ] || [ -z "$memory" ]; then fail "cannot read this machine from slurmd -C: $hardware"; fi
[ "$cpus" -ge 2 ] || skip "needs 2 CPUs for two jobs at once (slurmd -C: $hardware)"
export SLURM_CONF=$work/slurm.conf
mkdir -p "$work/state" "$work/spool" "$work/dev"
# Two GPUs as Slurm's GRES: Slurm hands a job its GPUs by their device files
# (here stand-ins: links to /dev/null and /dev/zero, as Slurm wants character
# devices) and sets CUDA_VISIBLE_DEVICES to their ordinals, which is all a node
# reads; no GPU is used.
ln -s /dev/null "$work/dev/nvidia0"
ln -s /dev/zero "$work/dev/nvidia1"
echo "NodeName=$host Name=gpu File=$work/dev/nvidia[0-1]" >"$work/gres.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=xpe2e
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=30
MinJobAge=600
InactiveLimit=0
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i -f "$SLURM_CONF" >"$work/logs/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$work/logs/slurmd.out" 2>&1 &
pids+=($!)
node_idle() { [ "$(sinfo -h -n "$host" -o %T 2>/dev/null)" = idle ]; }
wait_for 60 node_idle || fail "the Slurm node is not idle after 60 s: $(sinfo 2>&1)"
log "Slurm is up: $host with $cpus CPUs and $memory MB"

state_of() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1; }
job_ended() { case "$(state_of "$1")" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;; esac; return 1; }
job_running() { [ "$(state_of "$1")" = RUNNING ]; }

# --- 1. The whole cluster in one job ----------------------------------------
state1=$work/cluster
log "part 1: sbatch examples/slurm/cluster.sbatch"
job1=$(sbatch --parsable --chdir="$repo/examples/slurm" --cpus-per-task=2 --mem=1G --gres=gpu:2 \
  --output="$work/logs/cluster-%j.out" \
  --export=ALL,XP_BIN="$target",XP_STATE="$state1",XP_PORT="$(free_port)",XP_NODE_ROOT="$work" \
  "$repo/examples/slurm/cluster.sbatch" sweep.yaml)
wait_for 150 job_ended "$job1" || fail "job $job1 (cluster.sbatch) did not end within 150 s"
[ "$(state_of "$job1")" = COMPLETED ] || fail "job $job1 ended $(state_of "$job1")"
[ -s "$state1/status.json" ] || fail "cluster.sbatch left no status"
jq -e '[.trials[].state] | length == 3 and all(. == "succeeded")' "$state1/status.json" >/dev/null ||
  fail "the sweep did not succeed: $(cat "$state1/status.json")"
# Every attempt ran on the node inside job 1, which offered the job's 2 GPUs, 2 CPUs and 1 GiB.
node1=$(jq -r --arg job "$job1" 'select(.labels.slurm_job == $job) | .id' "$state1/nodes.json")
[ -n "$node1" ] || fail "no node labelled slurm_job=$job1: $(cat "$state1/nodes.json")"
jq -e --arg node "$node1" '[.trials[].attempts[].nodes[]] | all(. == $node)' "$state1/status.json" >/dev/null ||
  fail "a trial ran outside job $job1's node"
jq -e --arg node "$node1" 'select(.id == $node) | .cpus == 2 and .memory_bytes == 1073741824 and .gpus == 2' \
  "$state1/nodes.json" >/dev/null || fail "the node did not offer the job's grant: $(cat "$state1/nodes.json")"
log "part 1 passed: 3 trials succeeded on job $job1's node (2 GPUs, 2 CPUs, 1 GiB)"

# --- 2. Nodes from array jobs join a head; scancel moves a trial ------------
state2=$work/grow
mkdir -p "$state2"
chmod 700 "$state2"
port=$(free_port)
"$target/xp-head" start --listen "127.0.0.1:$port" --data-dir "$state2/head" \
  >"$state2/head.out" 2>"$work/logs/head2.log" &
pids+=($!)
wait_for 60 grep -q '^node: ' "$state2/head.out" || fail "the head did not start"
sed -n 's/^admin: //p' "$state2/head.out" >"$state2/admin.join"
export XP_CLUSTER
XP_CLUSTER=$(cat "$state2/admin.join")
xp() { "$target/xp" "$@"; }
submit_join() {
  sbatch --parsable --array=0 --chdir="$repo/examples/slurm" --cpus-per-task=1 --mem=512M --gres=gpu:1 \
    --output="$work/logs/join-%A_%a.out" \
    --export=ALL,XP_BIN="$target",XP_STATE="$state2",XP_NODE_ROOT="$work" \
    "$repo/examples/slurm/join.sbatch"
}
node_of_job() { xp nodes --json | jq -r --arg job "$1" 'select(.labels.slurm_job == $job and .state == "ready") | .id'; }
joined() { [ -n "$(node_of_job "$1")" ]; }

# A job holding GPU 0 throughout, so the nodes below get GPU 1: the ordinal a
# worker is given must be the one Slurm granted, not a count from 0.
sbatch --parsable --gres=gpu:1 --cpus-per-task=1 --mem=64M --output=/dev/null --wrap "sleep 600" >/dev/null
array_a=$(submit_join)
job_a=$array_a # the first task of an array has the array's id
wait_for 60 joined "$job_a" || fail "job $job_a's node did not join within 60 s"
node_a=$(node_of_job "$job_a")
xp nodes --json | jq -e --arg node "$node_a" 'select(.id == $node) | .gpus == 1 and .cpus == 1 and .memory_bytes == 536870912' >/dev/null ||
  fail "job $job_a's node did not offer 1 GPU (of the machine's 2), 1 CPU and 512 MiB: $(xp nodes --json)"
log "job $job_a's node $node_a joined, offering 1 GPU, 1 CPU and 512 MiB"

cat >"$state2/long.yaml" <<EOF
name: slurm-move
team: examples
trial:
  command: [python3, train.py]
  # This spec lies in the head's private directory: train.py is found here.
  command_dir: $repo/examples/slurm
  resources: {cpu: 1, gpu: 1}
  max_retries: 0
search:
  algorithm: grid
  space:
    steps: {choice: [80]}
    step_seconds: {choice: [0.25]}
    every: {choice: [5]}
  metric: loss
  mode: min
EOF
experiment=$(xp submit "$state2/long.yaml" | head -n 1)
trial_json() { xp status "$experiment" --json | jq -c '.trials[0]'; }
checkpointed() { trial_json | jq -e '.state == "running" and (.last_step // 0) >= 10' >/dev/null; }
wait_for 60 checkpointed || fail "the trial did not run past step 10 within 60 s: $(trial_json)"
[ "$(trial_json | jq -r '.attempts[0].nodes[0]')" = "$node_a" ] || fail "the trial did not start on job $job_a's node"

# The trial's checkpoints are only on job A's node and in the backup directory.
step_at_cancel=$(trial_json | jq '.last_step')
log "cancelling job $job_a at step $step_at_cancel"
scancel "$job_a"
wait_for 40 job_ended "$job_a" || fail "job $job_a did not end within 40 s of scancel"
grep -q "drained: every worker stopped" "$work/logs/join-${array_a}_0.out" ||
  fail "job $job_a's node did not drain: $(tail -n 20 "$work/logs/join-${array_a}_0.out")"
# Requeued (no retry: it has none), waiting for a node.
requeued() { trial_json | jq -e '.state == "queued" and (.attempts | length) == 1' >/dev/null; }
wait_for 20 requeued || fail "the trial was not requeued: $(trial_json)"
array_b=$(submit_join)
job_b=$array_b
wait_for 60 joined "$job_b" || fail "job $job_b's node did not join within 60 s"
node_b=$(node_of_job "$job_b")
log "job $job_b's node $node_b joined"
finished() { trial_json | jq -e '.state | IN("succeeded", "failed", "stopped", "cancelled")' >/dev/null; }
wait_for 90 finished || fail "the trial did not finish within 90 s: $(trial_json)"
trial=$(trial_json)
jq -e '.state == "succeeded"' <<<"$trial" >/dev/null || fail "the trial did not succeed: $trial"
jq -e --arg a "$node_a" --arg b "$node_b" \
  '(.attempts | length) == 2 and .attempts[0].nodes == [$a] and .attempts[1].nodes == [$b]
   and (.attempts[1].resumed_from.step // 0) >= 5' <<<"$trial" >/dev/null ||
  fail "the trial did not move from job $job_a's node to job $job_b's, resuming: $trial"
trial_id=$(jq -r '.id' <<<"$trial")
xp logs "$trial_id" | grep -q "resumed from step" || fail "the second attempt did not resume from the checkpoint"
# The worker was given the GPU Slurm granted job B, by the ordinal Slurm chose
# (1: another job holds GPU 0).
granted=$(scontrol show job -d "$job_b" | sed -n 's/.*GRES=gpu[^(]*(IDX:\([0-9]*\)).*/\1/p' | head -n 1)
[ "$granted" = 1 ] || fail "Slurm granted job $job_b GPU '$granted', not 1: $(scontrol show job -d "$job_b")"
xp logs "$trial_id" | grep -q "^CUDA_VISIBLE_DEVICES=1\$" ||
  fail "the worker did not get job $job_b's GPU 1: $(xp logs "$trial_id" | head -n 3)"
# Its checkpoint outlived job A's node: the new node read it from the backup.
grep -q "checkpoint object restored from the backup" "$work/logs/join-${array_b}_0.out" ||
  fail "job $job_b's node did not restore the checkpoint from the backup"
# It resumed from the checkpoint taken as job A's node drained, so no step was lost.
jq -e --argjson step "$step_at_cancel" '.attempts[1].resumed_from.step >= $step' <<<"$trial" >/dev/null ||
  fail "the trial resumed from before step $step_at_cancel: $trial"
log "part 2 passed: scancel of job $job_a moved the trial to job $job_b's node (GPU 1), resumed from step $(jq '.attempts[1].resumed_from.step' <<<"$trial")"
echo "slurm-e2e: passed"
