"""As a driver: submit experiments to a head, follow them and read their results.

``Client`` wraps the extension's client, which is the Rust SDK's ``Client``
(QUIC to the head, authenticated by the join string); statuses are the JSON
shapes of ``xp status --json`` as Python objects.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Union

from ._native import Client as _NativeClient
from .errors import XpError

if TYPE_CHECKING:
    import pandas

__all__ = ["Client", "Submitted", "ResultRow", "Results"]

PathLike = Union[str, "os.PathLike[str]"]


class Submitted(NamedTuple):
    """The head's answer to a submission."""

    experiment: str
    """The experiment id."""
    reused: bool
    """Whether an identical finished experiment answered instead of a new run."""
    trials: int
    """How many trials it has."""


@dataclass(frozen=True)
class ResultRow:
    """One trial of an experiment's results."""

    trial: str
    state: str
    config: Dict[str, Any] = field(default_factory=dict)
    """The trial's parameters and seed, typed as given."""
    metrics: Dict[str, float] = field(default_factory=dict)
    """The last value of each metric it reported."""


class Results(List[ResultRow]):
    """An experiment's trials, best first by its metric (trials without it last)."""

    def to_records(self) -> List[Dict[str, Any]]:
        """One flat dict per trial: ``trial``, ``state``, ``config.NAME``, ``metrics.NAME``."""
        records = []
        for row in self:
            record: Dict[str, Any] = {"trial": row.trial, "state": row.state}
            record.update({f"config.{name}": value for name, value in row.config.items()})
            record.update({f"metrics.{name}": value for name, value in row.metrics.items()})
            records.append(record)
        return records

    def to_pandas(self) -> "pandas.DataFrame":
        """The results as a DataFrame with the columns of ``to_records`` (needs pandas)."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError("Results.to_pandas() needs pandas: pip install pandas") from error
        return pandas.DataFrame.from_records(self.to_records())


ExperimentRef = Union[str, Submitted]


def _experiment_id(experiment: ExperimentRef) -> str:
    return experiment.experiment if isinstance(experiment, Submitted) else experiment


class Client:
    """A driver's connection to an xp head.

    ``join`` is a user credential (``xp://HOST:PORT?token=..&ca=..``, what
    ``xp-head start`` printed as ``admin:`` or ``xp-head user add`` made); by
    default the ``XP_CLUSTER`` environment variable, as for the ``xp`` CLI.
    Use it as a context manager to close the connection at the end.
    """

    def __init__(self, join: Optional[str] = None) -> None:
        join = join if join is not None else os.environ.get("XP_CLUSTER")
        if not join:
            raise XpError("no join string: pass one or set XP_CLUSTER")
        self._native = _NativeClient(join)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection."""
        self._native.close()

    def submit(
        self,
        spec: Union[Mapping[str, Any], PathLike],
        *,
        rerun: bool = False,
        base_dir: Optional[PathLike] = None,
    ) -> Submitted:
        """Submits an experiment: a spec as a dict (the YAML file's structure)
        or the path of a spec file. ``code``, ``data`` and ``program`` paths,
        and a command's relative paths (its ``trial.command_dir``), are
        relative to ``base_dir``: the spec file's directory, or the current
        directory for a dict. ``rerun`` runs it again even if an identical
        experiment finished."""
        if isinstance(spec, Mapping):
            # JSON is YAML, so the one strict parser reads both.
            text = json.dumps(dict(spec), allow_nan=False)
            base = Path(base_dir) if base_dir is not None else Path.cwd()
        else:
            path = Path(spec)
            text = path.read_text()
            base = Path(base_dir) if base_dir is not None else path.absolute().parent
        experiment, reused, trials = self._native.submit(text, os.fspath(base), rerun)
        return Submitted(experiment, reused, trials)

    def status(self, experiment: Optional[ExperimentRef] = None) -> Any:
        """One experiment's status (by id or unique prefix) as a dict, or
        every experiment's as a list; the shape of ``xp status --json``."""
        if experiment is None:
            return json.loads(self._native.status(None))
        listed = json.loads(self._native.status(_experiment_id(experiment)))
        return listed[0] if len(listed) == 1 else listed

    def results(self, experiment: ExperimentRef) -> Results:
        """The experiment's trials with their config and last metrics, best first."""
        rows = Results()
        for trial, state, config_json, metrics in self._native.results(_experiment_id(experiment)):
            rows.append(ResultRow(trial, state, json.loads(config_json), dict(metrics)))
        return rows

    def wait(self, experiment: ExperimentRef, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Waits until the experiment is no longer running and returns its status;
        raises ``WaitTimeout`` after ``timeout`` seconds when given."""
        if timeout is not None and (math.isnan(timeout) or timeout < 0):
            raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout}")
        status = json.loads(self._native.wait(_experiment_id(experiment), timeout))
        assert isinstance(status, dict)
        return status

    def cancel(self, id: ExperimentRef) -> int:
        """Cancels an experiment or one trial; returns how many trials it stopped."""
        return self._native.cancel(_experiment_id(id))

    def logs(
        self, trial: str, rank: int = 0, attempt: Optional[int] = None, max_bytes: int = 16 << 20
    ) -> str:
        """A worker's output (the latest attempt unless ``attempt``), at most
        ``max_bytes`` from the start."""
        return self._native.logs(trial, rank, attempt, max_bytes)

    def nodes(self) -> List[Dict[str, Any]]:
        """The nodes, as ``xp nodes --json`` shows them."""
        listed = json.loads(self._native.nodes())
        assert isinstance(listed, list)
        return listed

    def put(self, path: PathLike) -> str:
        """Stores a file in the cluster's object store; trials of experiments
        submitted on this connection can ``xp.get`` it by the returned id."""
        return self._native.put(os.fspath(path))

    def get(self, object_id: str, path: PathLike) -> Path:
        """Writes object ``object_id`` (verified against its id) to ``path``."""
        self._native.get(object_id, os.fspath(path))
        return Path(path)
