"""A Python trial on a real cluster: it reports, checkpoints, is preempted by a
higher-priority trial on its one-GPU node, and resumes from the checkpoint it
saved when asked to stop; and a checkpoint the node refuses raises its error."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Optional

from conftest import wait_until

SCRIPT = Path(__file__).with_name("trial_script.py")
STEPS = 60

PREEMPTION_POLICY = """\
priority_classes: {low: 0, high: 100}
preemption: {grace_period: 20s, min_run_time: 0s}
"""


def trial_spec(name: str, priority: str, steps: int, pause: float) -> Dict[str, Any]:
    return {
        "name": name,
        "team": "tests",
        "priority": priority,
        "trial": {
            "command": [sys.executable, str(SCRIPT)],
            "resources": {"cpu": 1, "gpu": 1},
        },
        "search": {
            "algorithm": "grid",
            "space": {
                "steps": {"choice": [steps]},
                "every": {"choice": [5]},
                "pause": {"choice": [pause]},
                "label": {"choice": ["python"]},
            },
        },
    }


def test_a_python_trial_is_preempted_and_resumes_from_its_checkpoint(make_cluster) -> None:
    cluster = make_cluster(PREEMPTION_POLICY)
    cluster.start_node("a", 1, 2)
    cluster.wait_for_nodes(1)
    client = cluster.client
    low = client.submit(trial_spec("py-low", "low", STEPS, 0.2))
    assert low.trials == 1 and not low.reused

    def checkpointed() -> Optional[bool]:
        # A report after step 5 means the checkpoint at 5 was stored: checkpoint()
        # returns only once the node has it.
        trial = client.status(low)["trials"][0]
        return True if (trial.get("last_step") or 0) >= 7 else None

    wait_until("the Python trial to checkpoint", 120, checkpointed)
    high = client.submit(
        {
            "name": "high",
            "team": "tests",
            "priority": "high",
            "trial": {"command": ["sleep", "1"], "resources": {"cpu": 1, "gpu": 1}},
        }
    )
    assert client.wait(high, timeout=180)["state"] == "succeeded"
    done = client.wait(low, timeout=300)
    assert done["state"] == "succeeded", done
    trial = done["trials"][0]
    attempts = trial["attempts"]
    assert len(attempts) >= 2, attempts
    assert attempts[0]["outcome"] == "preempted", attempts
    resumed = attempts[-1]["resumed_from"]
    assert resumed is not None and resumed["attempt"] == 1, attempts
    # The stop-time checkpoint is past the last periodic one (step 5 at least).
    assert resumed["step"] >= 7, attempts

    rows = client.results(low)
    assert len(rows) == 1
    row = rows[0]
    assert row.state == "succeeded"
    assert row.config["steps"] == STEPS and row.config["label"] == "python"
    # The sum survived the preemption exactly: nothing lost, nothing counted twice.
    assert row.metrics["final"] == sum(range(STEPS)), row.metrics
    # The last attempt said where it resumed, as the head recorded it.
    assert row.metrics["resumed_from"] == resumed["step"], row.metrics

    first_log = client.logs(trial["id"], attempt=1)
    assert f"stopping at step {resumed['step']}" in first_log, first_log
    assert "xp: stopped on request" in first_log, first_log
    last_log = client.logs(trial["id"])
    assert f"starts at step {resumed['step'] + 1}" in last_log, last_log


CHECKPOINT_REFUSED = """\
import xp
from pathlib import Path
import os
d = Path(os.environ["XP_WORK_DIR"]) / "big"
d.mkdir()
(d / "blob").write_bytes(b"x" * 8192)
try:
    xp.checkpoint(1, d)
except xp.CheckpointError as error:
    print(f"refused: {error}", flush=True)
    xp.report(1, refused=1)
else:
    xp.report(1, refused=0)
"""


def test_a_checkpoint_the_node_refuses_raises_its_error(make_cluster) -> None:
    cluster = make_cluster()
    cluster.start_node("a", 0, 2, "--object-memory", "0", "--object-disk", "2KiB")
    cluster.wait_for_nodes(1)
    script = cluster.write("refused.py", CHECKPOINT_REFUSED)
    run = cluster.client.submit(
        {
            "name": "refused",
            "team": "tests",
            "trial": {"command": [sys.executable, str(script)], "resources": {"cpu": 1}},
        }
    )
    done = cluster.client.wait(run, timeout=120)
    assert done["state"] == "succeeded", done
    assert cluster.client.results(run)[0].metrics["refused"] == 1
    log = cluster.client.logs(done["trials"][0]["id"])
    assert "refused: checkpoint:" in log, log
