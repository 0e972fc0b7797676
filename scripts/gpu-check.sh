#!/usr/bin/env bash
# The GPU paths, on a machine with an NVIDIA GPU, its driver and NCCL
# (libnccl.so on the library path): NVML discovery in the node, and NCCL through
# the rendezvous in the runtime. XP_GPU_TESTS=1 turns the tests' "skipping: no GPU"
# into failures, so a machine that cannot run them fails this script instead of
# passing it. On a fresh 16-core machine it builds and runs in about three minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

export XP_GPU_TESTS=1
export CARGO_INCREMENTAL=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
cargo test -p xp-runtime --features cuda --locked --lib nccl -- --nocapture
cargo test -p xp-node --locked --lib gpu -- --nocapture
echo "gpu-check: NVML and NCCL paths passed"
