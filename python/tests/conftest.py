"""The pytest harness: a real ``xp-head`` and ``xp-node`` on 127.0.0.1.

Like the Rust end-to-end tests (tests/common/mod.rs): the head listens on an
ephemeral port with a temporary data directory and prints its credentials
(``admin:`` for drivers, ``node:`` for nodes) on stdout; nodes join with the
node credential in ``XP_JOIN`` and declare GPU slots with ``--gpus`` on a
machine without GPUs. Binaries come from ``target/debug`` (built by
``cargo test --workspace`` or ``cargo build``), or ``XP_BIN_DIR``. Every
process is killed when the test ends; on failure the logs are printed.
Waits poll a condition until a generous deadline, never a bare sleep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, TypeVar

import pytest

import xp

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def bin_dir() -> Path:
    return Path(os.environ.get("XP_BIN_DIR", REPO / "target" / "debug"))


def binary(name: str) -> Path:
    path = bin_dir() / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build it first (cargo build -p xp-head -p xp-node)")
    return path


def wait_until(what: str, timeout: float, check: Callable[[], Optional[T]]) -> T:
    """Polls ``check`` every 100 ms until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class Cluster:
    """A head and its nodes, in a temporary directory."""

    def __init__(self, directory: Path, policy: Optional[str] = None) -> None:
        self.dir = directory
        # Workers run as the test's user (--worker-uids none on the nodes), but
        # keep the directory open like /tmp, as the Rust harness does.
        self.dir.chmod(0o1777)
        self.processes: Dict[str, subprocess.Popen[bytes]] = {}
        args = [
            str(binary("xp-head")),
            "start",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(directory / "head"),
            "--node-timeout",
            "10s",
        ]
        if policy is not None:
            path = directory / "policy.yaml"
            path.write_text(policy)
            args += ["--policy", str(path)]
        log = open(directory / "head.log", "wb")
        head = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "XP_LOG": "info"},
        )
        self.processes["head"] = head
        assert head.stdout is not None
        admin = None
        node = None
        for raw in head.stdout:
            line = raw.decode().strip()
            if line.startswith("admin: "):
                admin = line[len("admin: ") :]
            elif line.startswith("node: "):
                node = line[len("node: ") :]
                break
        if admin is None or node is None:
            self.close(failed=True)
            raise AssertionError("the head printed no credentials")
        self.join: str = admin
        self.node_join: str = node
        # Keep draining stdout so the head never blocks on a full pipe.
        stdout = head.stdout
        threading.Thread(target=lambda: stdout.read(), daemon=True).start()
        self.client = xp.Client(self.join)

    def start_node(
        self,
        name: str,
        gpus: int,
        cpus: int,
        *extra: str,
        worker_uids: bool = False,
        env: Optional[Dict[str, str]] = None,
    ) -> None:
        """Starts node ``name``; ``worker_uids`` keeps a root node's default of a
        user id per trial attempt, ``env`` is its environment (the test's by
        default), which its workers inherit."""
        log = open(self.dir / f"node-{name}.log", "wb")
        # --worker-uids none by default: a root node would run workers under user
        # ids of their own, which cannot reach an interpreter installed under
        # /root (as this suite's venv usually is).
        uids = [] if worker_uids else ["--worker-uids", "none"]
        self.processes[f"node-{name}"] = subprocess.Popen(
            [
                str(binary("xp-node")),
                "join",
                "--data-dir",
                str(self.dir / f"node-{name}"),
                "--gpus",
                str(gpus),
                "--cpus",
                str(cpus),
                "--label",
                f"name={name}",
                *uids,
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**(os.environ if env is None else env), "XP_JOIN": self.node_join, "XP_LOG": "info"},
        )

    def wait_for_nodes(self, count: int) -> None:
        def ready() -> Optional[bool]:
            nodes = self.client.nodes()
            return True if sum(node.get("state") == "ready" for node in nodes) >= count else None

        wait_until(f"{count} ready nodes", 60, ready)

    def write(self, name: str, text: str) -> Path:
        path = self.dir / name
        path.write_text(text)
        return path

    def close(self, failed: bool) -> None:
        if failed:
            for log in sorted(self.dir.glob("*.log")):
                sys.stderr.write(f"===== {log.name} =====\n{log.read_text(errors='replace')}\n")
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.fixture
def make_cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Cluster]]:
    made: List[Cluster] = []

    def make(policy: Optional[str] = None) -> Cluster:
        cluster = Cluster(tmp_path_factory.mktemp("cluster"), policy)
        made.append(cluster)
        return cluster

    yield make
    failed = bool(getattr(request.node, "failed", False))
    for cluster in made:
        cluster.close(failed)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.failed = True  # type: ignore[attr-defined]
    return report
