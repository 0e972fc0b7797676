"""Outside a cluster each trial call does something sensible and says so once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

LOCAL_SCRIPT = textwrap.dedent(
    """\
    import json, os, signal, sys, warnings
    from pathlib import Path
    import xp
    warnings.simplefilter("default")
    assert not xp.in_trial()
    cfg = xp.config()
    state = Path("state")
    start = xp.restore(state)
    first = 0 if start is None else start + 1
    print("start", first, json.dumps(cfg), xp.seed(), xp.rank(), xp.world_size(), flush=True)
    for step in range(first, first + 2):
        xp.report(step, loss=1.0 / (step + 1))
        state.mkdir(exist_ok=True)
        (state / "step.txt").write_text(str(step))
        xp.checkpoint(step, state)
    stop = xp.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    print("stop", stop, xp.should_stop(), flush=True)
    oid = xp.put(state / "step.txt")
    xp.get(oid, "copy.txt")
    print("object", Path("copy.txt").read_text(), flush=True)
    """
)


def run_local(directory: Path) -> subprocess.CompletedProcess[str]:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith("XP_")
    }
    env["XP_CONFIG"] = json.dumps({"lr": 0.1, "layers": 3, "name": "local"})
    env["XP_SEED"] = "7"
    script = directory / "local.py"
    script.write_text(LOCAL_SCRIPT)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_script_runs_locally_and_resumes_from_its_local_checkpoint(tmp_path: Path) -> None:
    first = run_local(tmp_path)
    assert first.returncode == 0, first.stderr
    assert 'start 0 {"lr": 0.1, "layers": 3, "name": "local"} 7 0 1' in first.stdout
    assert "stop False True" in first.stdout
    assert "object 1" in first.stdout
    assert "xp report step 0: loss=1" in first.stderr
    assert "xp report step 1: loss=0.5" in first.stderr
    # Each kind of call says once that it ran locally.
    assert first.stderr.count("report() prints metrics to stderr") == 1, first.stderr
    assert first.stderr.count("checkpoint() copies to") == 1, first.stderr
    assert (tmp_path / ".xp-local" / "checkpoint" / "step.txt").read_text() == "1"
    # A second run resumes after the last local checkpoint.
    second = run_local(tmp_path)
    assert second.returncode == 0, second.stderr
    assert "start 2 " in second.stdout, second.stdout


def test_a_broken_node_environment_is_a_clear_error(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("XP_")}
    env["XP_TRIAL_ID"] = "abc"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import xp\ntry:\n    xp.config()\nexcept xp.errors.TrialEnvironmentError as e:\n    print('error:', e)\n",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "error: environment variable XP_CONFIG is missing" in result.stdout, result
