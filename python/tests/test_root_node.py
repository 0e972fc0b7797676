"""The Python guide's trial example, unchanged, on a root node that runs each
trial attempt under a user id of its own, with the interpreter in a usual place:
a venv made from ``/usr/bin/python3`` that holds the xp package, first on the
PATH the node was started with (as after ``source venv/bin/activate``), while
pyenv's shims under ``/root`` (which the worker's id cannot reach) may come
after it.

The example (docs/guide/python.md, the block under "Inside a trial") is read
from the guide itself and preceded by the two functions it leaves to the user;
``train_one_step`` crashes once, in the first attempt, after the checkpoint at
step 50. So the test shows that ``xp.checkpoint(step, "ckpt")`` and
``xp.restore("ckpt")`` work with relative paths (the worker runs in its own
directory, which its id owns), that ``command: [python3, train.py]`` finds the
script next to the spec, that the failed attempt's outcome ends with the
traceback, and that the retry resumes from step 50 and succeeds.

Only root can run workers under their own ids, and the test needs a system
interpreter that is not the one running it; elsewhere it skips, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import xp
from conftest import REPO, Cluster

SYSTEM_PYTHON = Path("/usr/bin/python3")

PRELUDE = '''\
import os
import xp

xp.report(0, uid=os.getuid())


def train_one_step():
    if xp.attempt() == 1 and step == 60:
        raise RuntimeError("simulated crash at step 60")
    return 1.0 / (step + 1)


def save_model(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as model:
        model.write(str(step))

'''

SPEC = """\
name: python-on-a-root-node
team: tests
trial:
  command: [python3, train.py]
  resources: {cpu: 1}
  max_retries: 1
search:
  algorithm: grid
  space:
    steps: {choice: [80]}
"""


def guide_example() -> str:
    """The guide's trial example: the first python block after "Inside a trial"."""
    guide = (REPO / "docs" / "guide" / "python.md").read_text()
    section = guide[guide.index("## Inside a trial") :]
    match = re.search(r"```python[^\n]*\n(.*?)```", section, re.S)
    assert match is not None, "the guide has a Python trial example"
    return match.group(1)


def venv_with_xp(directory: Path) -> Path:
    """A venv made from the system interpreter, holding the xp package this
    test imports (its extension is abi3); its bin directory."""
    venv = directory / "venv"
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run(
        [str(venv / "bin" / "python3"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    shutil.copytree(Path(xp.__file__).parent, Path(purelib) / "xp")
    return venv / "bin"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may enter (as the Rust harness's are), so the
    node's work directories and the venv are within the worker's reach."""
    base = REPO / "target" / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="root-node-", dir=base))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_the_guides_python_trial_runs_unchanged_on_a_root_node(shared_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a node running as root runs workers under user ids of their own")
    if not SYSTEM_PYTHON.exists() or Path(sys.executable).resolve() == SYSTEM_PYTHON.resolve():
        pytest.skip(f"needs {SYSTEM_PYTHON}, other than the interpreter running the tests")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("the abi3 extension does not load in a free-threaded interpreter")
    bin_dir = venv_with_xp(shared_dir)
    project = shared_dir / "project"
    project.mkdir()
    (project / "train.py").write_text(PRELUDE + guide_example())
    (project / "sweep.yaml").write_text(SPEC)
    cluster_dir = shared_dir / "cluster"
    cluster_dir.mkdir()
    cluster = Cluster(cluster_dir)
    try:
        node_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        cluster.start_node("a", 0, 2, worker_uids=True, env=node_env)
        cluster.wait_for_nodes(1)
        client = cluster.client
        (node,) = client.nodes()
        assert node["isolation"].startswith("uid"), node
        run = client.submit(str(project / "sweep.yaml"))
        done = client.wait(run, timeout=180)
        trial = done["trials"][0]
        assert done["state"] == "succeeded", done
        first, last = trial["attempts"][0], trial["attempts"][-1]
        assert first["outcome"].startswith("failed: rank 0 exited with status 1: "), first
        assert first["outcome"].endswith("RuntimeError: simulated crash at step 60"), first
        assert "Traceback (most recent call last):" in first["outcome"], first
        assert last["resumed_from"]["step"] == 50, trial
        assert trial["metrics"]["uid"] > 0, trial
        assert trial["last_step"] == 79, trial
    except BaseException:
        cluster.close(failed=True)
        raise
    else:
        cluster.close(failed=False)
