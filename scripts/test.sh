#!/usr/bin/env bash
# The README's test command: every test of the repository, as CI runs it after
# fmt and clippy (.ci/run). The Rust workspace's tests (unit, property and
# end-to-end with real xp-head and xp-node processes), the NCCL tests (which
# skip with a printed reason without a GPU), the Python package's pytest suite
# against a real head and node, and a real Slurm cluster on 127.0.0.1 running
# examples/slurm. It ends with one line: `summary: N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# The NCCL tests run on a GPU machine and print why they skip elsewhere.
cargo test -p xp-runtime --features cuda --locked --lib nccl -- --nocapture 2>&1 | tee -a "$log"

# ---- The Python package (python/) ------------------------------------------
# Installed as a user would (`pip install ./python`, maturin as the PEP 517
# backend) into a fresh venv, then its pytest suite runs against the xp-head
# and xp-node that `cargo test` built above. A dev build, not maturin's default
# release: it reuses target/debug's SDK and dependencies instead of compiling
# them again (PYO3_BUILD_EXTENSION_MODULE in .cargo/config.toml matches
# maturin's, so cargo and maturin share artifacts).
py_venv=target/python-venv
rm -rf "$py_venv"
# Debian's python3 makes venvs only with python3-venv (ensurepip) installed.
if ! python3 -m venv "$py_venv" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
  fi
  rm -rf "$py_venv"
  python3 -m venv "$py_venv"
fi
# pandas too, so that `Results.to_pandas()` is tested, not skipped.
"$py_venv/bin/pip" install -q --disable-pip-version-check "pytest>=7.4" pandas
MATURIN_PEP517_ARGS="--profile dev" "$py_venv/bin/pip" install -q --disable-pip-version-check ./python
XP_BIN_DIR="$PWD/target/debug" "$py_venv/bin/pytest" -q -rs python/tests 2>&1 | tee -a "$log"
# ---------------------------------------------------------------------------

# --- xp on Slurm (issue 17) --------------------------------------------------
# Real slurmctld and slurmd (Debian's 22.05, with munge; the script installs them
# when absent) on 127.0.0.1 run examples/slurm: a sweep inside one job, then a
# trial moved by scancel to a second job's node, resuming from its checkpoint.
# It starts and stops its own daemons and skips with a printed reason where it
# cannot run (not root).
XP_TARGET_DIR="$PWD/target/debug" scripts/slurm-e2e.sh 2>&1 | tee -a "$log"
# ---------------------------------------------------------------------------

# Cargo's last block is often a crate's empty doc-test run; close with the totals
# (cargo's `test result:` lines and pytest's closing `N passed, N failed` line).
awk '/^[0-9]+ (passed|failed)/ { for (i = 1; i < NF; i++) { if ($(i + 1) ~ /^passed/) passed += $i; if ($(i + 1) ~ /^failed/) failed += $i } }
/^test result:/ { passed += $4; failed += $6 } END { printf "summary: %d passed, %d failed\n", passed, failed }' "$log"
