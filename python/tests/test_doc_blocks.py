"""Docs that cannot lie, in Python: the ``python tested`` blocks of README.md
and docs/ run here, against a real head and node, with the package
installed. A block runs in a fresh directory where the ``yaml tested
file=NAME`` blocks before it in its document are written, with
``XP_CLUSTER`` set to the cluster's admin; it passes when it exits 0. The
shell and YAML blocks run in tests/doc_blocks.rs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

from conftest import REPO

Block = Tuple[str, str, List[str], str]


def blocks_of(path: Path) -> Iterator[Block]:
    """(place, language, the info string's other words, text) of each fenced block."""
    open_block = None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            if open_block is None:
                words = stripped[3:].split()
                place = f"{path.relative_to(REPO)}:{number}"
                open_block = (place, words[0] if words else "", words[1:], [])
            else:
                place, language, words, lines = open_block
                yield place, language, words, "".join(lines)
                open_block = None
        elif open_block is not None:
            open_block[3].append(line + "\n")


def documents() -> List[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_the_docs_tested_python_blocks_run(make_cluster, tmp_path: Path) -> None:
    cluster = make_cluster()
    cluster.start_node("a", 0, 2)
    cluster.wait_for_nodes(1)
    ran = 0
    for document in documents():
        workdir = tmp_path / document.stem
        workdir.mkdir(exist_ok=True)
        for place, language, words, text in blocks_of(document):
            if "tested" not in words:
                continue
            names = [word[len("file=") :] for word in words if word.startswith("file=")]
            if language == "yaml" and names:
                (workdir / names[0]).write_text(text)
            elif language == "python":
                done = subprocess.run(
                    [sys.executable, "-c", text],
                    cwd=workdir,
                    env={**os.environ, "XP_CLUSTER": cluster.join},
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                assert done.returncode == 0, f"{place} failed:\n{done.stdout}\n{done.stderr}"
                ran += 1
    assert ran >= 1, "no python block of the docs is marked tested"
