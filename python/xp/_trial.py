"""Inside a trial: configuration, metrics, checkpoints, preemption and objects.

In a worker a node started (``XP_TRIAL_ID`` is set) every call goes through the
extension, which wraps the Rust SDK's ``TrialContext``: metric and checkpoint
lines, the wait for the node's verdict on a checkpoint, the SIGTERM watch and
the node's object channel are the Rust SDK's, never reimplemented here.

Outside a cluster each call does something sensible and says so once (a
``LocalRunWarning``), so the same script runs on a laptop:

- ``config()`` reads ``XP_CONFIG`` (JSON text), else the file named by
  ``XP_CONFIG_FILE`` (JSON, or YAML when PyYAML is installed), else is empty;
- ``seed()`` is ``XP_SEED`` or 0; ``rank()`` and ``world_size()`` are
  ``RANK`` and ``WORLD_SIZE`` (as ``torchrun`` sets them) or 0 and 1;
- ``report()`` prints the metrics to stderr;
- ``checkpoint()`` copies the directory to ``.xp-local/checkpoint`` (or under
  ``XP_LOCAL_DIR``), and ``restore()`` copies the last one back, so a local run
  that was interrupted resumes like a trial does (delete the folder to start
  afresh);
- ``should_stop()`` turns SIGTERM into a flag, as in a cluster;
- ``put()``/``get()`` keep objects in ``.xp-local/objects``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import numbers
import os
import shutil
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple, Union

if TYPE_CHECKING:
    from ._native import Trial

__all__ = [
    "LocalRunWarning",
    "in_trial",
    "config",
    "seed",
    "rank",
    "world_size",
    "attempt",
    "report",
    "checkpoint",
    "checkpoint_dir",
    "restore",
    "should_stop",
    "put",
    "get",
]

PathLike = Union[str, "os.PathLike[str]"]

#: The exit status of a trial that ends after a stop was requested: what a
#: process ended by SIGTERM reports, so the head resumes the trial later rather
#: than recording it finished (the Rust SDK's rule for trainables).
STOPPED_STATUS = 128 + signal.SIGTERM


class LocalRunWarning(UserWarning):
    """Issued once per kind of call made outside a cluster, saying what it did instead."""


_lock = threading.Lock()
_trial: Optional["Trial"] = None
_trial_read = False
_warned: Set[str] = set()
_local_stop = threading.Event()
_stop_watch_installed = False


def in_trial() -> bool:
    """Whether a node started this process as a trial's worker (``XP_TRIAL_ID`` is set)."""
    return "XP_TRIAL_ID" in os.environ


def _native_trial() -> Optional["Trial"]:
    """The extension's view of this trial, read once; ``None`` outside a cluster.

    Raises ``TrialEnvironmentError`` when ``XP_TRIAL_ID`` is set but the rest of
    the node's contract is missing or malformed.
    """
    global _trial, _trial_read
    with _lock:
        if not _trial_read:
            if in_trial():
                from ._native import Trial

                _trial = Trial.from_env()
            _trial_read = True
        return _trial


def _say_once(kind: str, message: str) -> None:
    with _lock:
        if kind in _warned:
            return
        _warned.add(kind)
    warnings.warn(f"xp: not in a cluster: {message}", LocalRunWarning, stacklevel=3)


def _local_dir() -> Path:
    return Path(os.environ.get("XP_LOCAL_DIR", ".xp-local")).absolute()


def config() -> Dict[str, Any]:
    """The trial's parameters, each with the type it was given (a fresh dict)."""
    trial = _native_trial()
    if trial is not None:
        loaded = json.loads(trial.config_json)
        assert isinstance(loaded, dict)
        return loaded
    text = os.environ.get("XP_CONFIG")
    if text is not None:
        _say_once("config", "config() reads XP_CONFIG")
        return _as_config(json.loads(text), "XP_CONFIG")
    path = os.environ.get("XP_CONFIG_FILE")
    if path is not None:
        _say_once("config", f"config() reads {path} (XP_CONFIG_FILE)")
        return _as_config(_read_config_file(Path(path)), path)
    _say_once("config", "config() is empty (set XP_CONFIG or XP_CONFIG_FILE)")
    return {}


def _as_config(value: Any, source: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{source} must hold a mapping of parameters, not {type(value).__name__}")
    return value


def _read_config_file(path: Path) -> Any:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError as error:
            raise ImportError(f"reading {path} needs PyYAML; or give the config as JSON") from error
        return yaml.safe_load(text)
    return json.loads(text)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {text!r}") from None


def seed() -> int:
    """The trial's replicate seed (``XP_SEED`` or 0 outside a cluster)."""
    trial = _native_trial()
    if trial is not None:
        return trial.seed
    _say_once("seed", "seed() is XP_SEED or 0")
    return _env_int("XP_SEED", 0)


def rank() -> int:
    """This worker's rank in its trial's gang (``RANK`` or 0 outside a cluster)."""
    trial = _native_trial()
    if trial is not None:
        return trial.rank
    return _env_int("RANK", 0)


def world_size() -> int:
    """The number of workers in the trial (``WORLD_SIZE`` or 1 outside a cluster)."""
    trial = _native_trial()
    if trial is not None:
        return trial.world_size
    return _env_int("WORLD_SIZE", 1)


def attempt() -> int:
    """Which attempt of the trial this is, from 1 (1 outside a cluster)."""
    trial = _native_trial()
    return trial.attempt if trial is not None else 1


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    return int(step)


def report(step: int, **metrics: Any) -> None:
    """Records ``metrics`` (numbers, or anything ``float()`` takes, such as a
    NumPy scalar or a one-element tensor) at ``step`` under this trial."""
    step = _check_step(step)
    values: List[Tuple[str, float]] = []
    for name, value in metrics.items():
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError(f"metric {name!r} must be a number, not {value!r}")
        try:
            values.append((name, float(value)))
        except (TypeError, ValueError):
            raise TypeError(f"metric {name!r} must be a number, not {value!r}") from None
    trial = _native_trial()
    if trial is not None:
        # Python buffers its own stdout; flush it so the metric line the
        # extension writes never lands in the middle of a printed line.
        _flush_stdout()
        trial.report(step, values)
        return
    _say_once("report", "report() prints metrics to stderr")
    shown = " ".join(f"{name}={value:g}" for name, value in values)
    print(f"xp report step {step}: {shown}", file=sys.stderr, flush=True)


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        pass


def checkpoint_dir() -> Path:
    """Where the node takes checkpoint files from (``XP_CHECKPOINT_DIR``):
    writing there directly saves ``checkpoint()`` a copy."""
    trial = _native_trial()
    if trial is not None:
        return Path(trial.checkpoint_dir)
    return _local_dir() / "checkpoint"


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _replace_contents(source: Path, destination: Path) -> None:
    """Makes ``destination`` hold exactly ``source``'s files (links followed)."""
    if not source.is_dir():
        raise NotADirectoryError(f"{source} is not a directory")
    destination.mkdir(parents=True, exist_ok=True)
    for entry in destination.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    shutil.copytree(source, destination, dirs_exist_ok=True)


def checkpoint(step: int, directory: Optional[PathLike] = None) -> None:
    """Saves the files in ``directory`` as the trial's checkpoint at ``step`` and
    returns once the node has stored them; raises ``CheckpointError`` with the
    node's reason when it did not (the trial may go on either way).

    Without ``directory`` the files already in ``checkpoint_dir()`` are saved.
    Only rank 0 checkpoints: on other ranks this returns at once.
    """
    step = _check_step(step)
    trial = _native_trial()
    if trial is not None:
        if trial.rank != 0:
            return
        target = Path(trial.checkpoint_dir)
        if directory is not None and not _same_dir(Path(directory), target):
            _replace_contents(Path(directory), target)
        _flush_stdout()
        trial.commit_checkpoint(step)
        return
    local = _local_dir()
    _say_once("checkpoint", f"checkpoint() copies to {local / 'checkpoint'}")
    target = local / "checkpoint"
    if directory is not None and not _same_dir(Path(directory), target):
        _replace_contents(Path(directory), target)
    target.mkdir(parents=True, exist_ok=True)
    step_file = local / "checkpoint.step"
    temporary = local / ".checkpoint.step.tmp"
    temporary.write_text(str(step))
    temporary.replace(step_file)


def restore(directory: Optional[PathLike] = None) -> Optional[int]:
    """The step of the checkpoint this attempt resumes from, with its files
    copied into ``directory`` (when given; they are in ``checkpoint_dir()``
    anyway), or ``None`` on a fresh start."""
    trial = _native_trial()
    if trial is not None:
        step = trial.resume_step
        source = Path(trial.checkpoint_dir)
    else:
        local = _local_dir()
        _say_once("restore", f"restore() reads the last local checkpoint in {local}")
        step_file = local / "checkpoint.step"
        if not step_file.exists():
            return None
        step = int(step_file.read_text().strip())
        source = local / "checkpoint"
    if step is None:
        return None
    if directory is not None and not _same_dir(source, Path(directory)):
        Path(directory).mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, Path(directory), dirs_exist_ok=True)
    return step


def should_stop() -> bool:
    """Whether the trial has been asked to stop (preempted, cancelled, or its
    node leaving): checkpoint and return when it is.

    The first call installs the watch: from then on SIGTERM no longer ends the
    process at once but sets this flag, and the grace period before SIGKILL is
    the time to save. A process that ends normally after a stop was requested
    exits with status 143, as if SIGTERM had ended it, so the trial resumes
    later instead of counting as finished.
    """
    global _stop_watch_installed
    trial = _native_trial()
    if trial is not None:
        stopped = trial.stop_requested()
        with _lock:
            install = not _stop_watch_installed
            _stop_watch_installed = True
        if install:
            atexit.register(_exit_stopped_if_asked)
        return stopped
    with _lock:
        install = not _stop_watch_installed
        _stop_watch_installed = True
    if install:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda _signum, _frame: _local_stop.set())
        else:
            _say_once("stop", "should_stop() can only watch SIGTERM from the main thread")
    return _local_stop.is_set()


def _exit_stopped_if_asked() -> None:
    trial = _native_trial()
    if trial is None or not trial.stop_requested():
        return
    _flush_stdout()
    if "logging" in sys.modules:
        logging.shutdown()
    try:
        sys.stderr.write("xp: stopped on request\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
    os._exit(STOPPED_STATUS)


def put(path: PathLike) -> str:
    """Stores the file at ``path`` in the node's object store for this trial and
    returns its id; every worker of the trial, on any node, can ``get`` it."""
    trial = _native_trial()
    if trial is not None:
        return trial.put(os.fspath(path))
    objects = _local_dir() / "objects"
    _say_once("objects", f"put() and get() keep objects in {objects}")
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    object_id = "local-" + digest.hexdigest()
    objects.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, objects / object_id)
    return object_id


def get(object_id: str, path: PathLike) -> Path:
    """Copies object ``object_id`` (fetched from another node if need be, and
    verified against its id) to the file ``path``; returns ``path``."""
    trial = _native_trial()
    if trial is not None:
        trial.get(object_id, os.fspath(path))
        return Path(path)
    objects = _local_dir() / "objects"
    _say_once("objects", f"put() and get() keep objects in {objects}")
    stored = objects / object_id
    if "/" in object_id or not stored.is_file():
        from .errors import ObjectError

        raise ObjectError(f"no local object {object_id!r} in {objects}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(stored, path)
    return Path(path)
