"""A PyTorch Lightning callback that reports metrics and checkpoints through xp.

Importing this module imports Lightning (``lightning.pytorch``, else
``pytorch_lightning``); ``import xp`` alone never does. Usage::

    from xp.integrations.lightning import XpCallback
    callback = XpCallback(checkpoint_every_n_epochs=1)
    trainer = lightning.Trainer(callbacks=[callback], ...)
    trainer.fit(model, ckpt_path=callback.resume_path())

- After every validation (and every training epoch) the trainer's logged metrics
  (``trainer.callback_metrics``) are reported at the trainer's global step.
- Every ``checkpoint_every_n_epochs`` epochs the trainer saves ``last.ckpt``
  into ``xp.checkpoint_dir()`` and xp stores it; ``resume_path()`` is that file
  when the trial resumes (``None`` on a fresh start).
- When xp asks the trial to stop (preemption), the callback saves a checkpoint
  at the end of the current batch and stops the trainer; the trial resumes from
  it later.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Dict, Optional

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # the standalone package
    from pytorch_lightning import Callback, LightningModule, Trainer  # type: ignore[no-redef]

import xp

__all__ = ["XpCallback"]

CHECKPOINT_FILE = "last.ckpt"


def _numbers(metrics: Dict[str, Any]) -> Dict[str, float]:
    """The metrics that are numbers or one-element tensors, as floats."""
    values: Dict[str, float] = {}
    for name, value in metrics.items():
        if hasattr(value, "numel") and value.numel() == 1:
            values[name] = float(value.item())
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            values[name] = float(value)
    return values


class XpCallback(Callback):  # type: ignore[misc]
    """Reports Lightning's logged metrics to xp, checkpoints through xp and
    stops cleanly when xp preempts the trial."""

    def __init__(self, checkpoint_every_n_epochs: Optional[int] = 1) -> None:
        super().__init__()
        if checkpoint_every_n_epochs is not None and checkpoint_every_n_epochs < 1:
            raise ValueError("checkpoint_every_n_epochs must be at least 1 (or None)")
        self.checkpoint_every_n_epochs = checkpoint_every_n_epochs
        self.last_checkpoint_step: Optional[int] = None

    def resume_path(self) -> Optional[str]:
        """The Lightning checkpoint to resume from, or ``None`` on a fresh start:
        pass it as ``trainer.fit(..., ckpt_path=...)``."""
        if xp.restore() is None:
            return None
        path = xp.checkpoint_dir() / CHECKPOINT_FILE
        return str(path) if path.exists() else None

    def _report(self, trainer: Trainer) -> None:
        values = _numbers(dict(trainer.callback_metrics))
        if values and trainer.is_global_zero:
            xp.report(int(trainer.global_step), **values)

    def _checkpoint(self, trainer: Trainer) -> None:
        step = int(trainer.global_step)
        if step == self.last_checkpoint_step:
            return
        directory: Path = xp.checkpoint_dir()
        if trainer.is_global_zero:
            directory.mkdir(parents=True, exist_ok=True)
        # Every rank calls save_checkpoint (it is collective); rank 0 writes.
        trainer.save_checkpoint(str(directory / CHECKPOINT_FILE))
        xp.checkpoint(step)
        self.last_checkpoint_step = step

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._report(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer)
        every = self.checkpoint_every_n_epochs
        if every is not None and (trainer.current_epoch + 1) % every == 0:
            self._checkpoint(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if xp.should_stop():
            self._checkpoint(trainer)
            trainer.should_stop = True
