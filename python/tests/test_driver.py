"""A Python driver against a real cluster: it submits a small sweep from a YAML
file, waits, reads the results (best first, typed config, metrics), and meets
the typed errors; plus cancel and objects."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import xp

from conftest import wait_until

SWEEP_TRIAL = """\
import xp
cfg = xp.config()
x = cfg["x"]
xp.report(1, loss=float((x - 3) ** 2), x_seen=x)
"""

SWEEP = """\
name: py-sweep
team: tests
trial:
  command: [{python}, {script}]
  resources: {{cpu: 1}}
search:
  algorithm: grid
  space:
    x: {{choice: [1, 2, 3, 4, 6]}}
  metric: loss
  mode: min
"""


def test_a_driver_submits_a_sweep_waits_and_reads_the_results(make_cluster) -> None:
    cluster = make_cluster()
    cluster.start_node("a", 0, 2)
    cluster.wait_for_nodes(1)
    script = cluster.write("sweep_trial.py", SWEEP_TRIAL)
    spec = cluster.write("sweep.yaml", SWEEP.format(python=sys.executable, script=script))
    with xp.Client(cluster.join) as client:
        run = client.submit(spec)
        assert run.trials == 5 and not run.reused
        status = client.wait(run, timeout=300)
        assert status["state"] == "succeeded", status
        rows = client.results(run)
        assert [row.config["x"] for row in rows][:2] in ([3, 2], [3, 4]), rows
        assert rows[0].metrics["loss"] == 0.0
        assert all(row.state == "succeeded" for row in rows)
        for row in rows:
            assert isinstance(row.config["x"], int)
            assert row.metrics["loss"] == (row.config["x"] - 3) ** 2
            assert row.metrics["x_seen"] == row.config["x"]
        assert {row.config["x"] for row in rows} == {1, 2, 3, 4, 6}
        records = rows.to_records()
        assert records[0]["config.x"] == 3 and records[0]["metrics.loss"] == 0.0
        # The same experiment again is the finished one, reused.
        again = client.submit(spec)
        assert again.experiment == run.experiment and again.reused
        listed = client.status()
        assert any(experiment["id"] == run.experiment for experiment in listed)
        by_prefix = client.status(run.experiment[:8])
        assert by_prefix["id"] == run.experiment and by_prefix["name"] == "py-sweep"


def test_results_convert_to_pandas(make_cluster) -> None:
    pandas = pytest.importorskip("pandas", reason="pandas is not installed")
    cluster = make_cluster()
    cluster.start_node("a", 0, 2)
    cluster.wait_for_nodes(1)
    script = cluster.write("sweep_trial.py", SWEEP_TRIAL)
    spec = cluster.write("sweep.yaml", SWEEP.format(python=sys.executable, script=script))
    run = cluster.client.submit(spec)
    cluster.client.wait(run, timeout=300)
    frame = cluster.client.results(run).to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert len(frame) == 5 and frame["metrics.loss"].min() == 0.0


def test_errors_are_typed_and_carry_the_heads_words(make_cluster) -> None:
    cluster = make_cluster()
    client = cluster.client
    with pytest.raises(xp.NotFoundError) as missing:
        client.status("no-such-experiment")
    assert isinstance(missing.value, LookupError)
    with pytest.raises(xp.SpecError, match="nmae|unknown field"):
        client.submit({"nmae": "typo", "team": "tests", "trial": {"command": ["true"]}})
    with pytest.raises(xp.errors.JoinStringError):
        xp.Client("not a join string")
    with pytest.raises(FileNotFoundError):
        client.submit(Path(cluster.dir) / "missing.yaml")


def test_cancel_stops_a_running_sweep_and_objects_reach_trials(make_cluster) -> None:
    cluster = make_cluster()
    cluster.start_node("a", 0, 2)
    cluster.wait_for_nodes(1)
    client = cluster.client
    payload = cluster.write("payload.txt", "hello from the driver\n")
    object_id = client.put(payload)
    reader = cluster.write(
        "reader.py",
        "import os, sys, xp\n"
        "out = os.path.join(os.environ['XP_WORK_DIR'], 'got.txt')\n"
        "xp.get(sys.argv[1], out)\n"
        "print('got:', open(out).read().strip(), flush=True)\n"
        "kept = xp.put(out)\n"
        "print('kept:', kept, flush=True)\n"
        "xp.report(1, ok=1)\n",
    )
    read = client.submit(
        {
            "name": "reader",
            "team": "tests",
            "trial": {"command": [sys.executable, str(reader), object_id], "resources": {"cpu": 1}},
        }
    )
    done = client.wait(read, timeout=120)
    assert done["state"] == "succeeded", done
    log = client.logs(done["trials"][0]["id"])
    assert "got: hello from the driver" in log, log
    # The same bytes, so the same content address.
    assert f"kept: {object_id}" in log, log
    fetched = client.get(object_id, Path(cluster.dir) / "back.txt")
    assert fetched.read_text() == "hello from the driver\n"

    sleeper = client.submit(
        {
            "name": "sleeper",
            "team": "tests",
            "trial": {"command": ["sleep", "600"], "resources": {"cpu": 1}},
        }
    )
    wait_until(
        "the sleeper to run",
        60,
        lambda: True if client.status(sleeper)["trials"][0]["state"] == "running" else None,
    )
    assert client.cancel(sleeper) == 1
    assert client.wait(sleeper, timeout=120)["state"] == "cancelled"
