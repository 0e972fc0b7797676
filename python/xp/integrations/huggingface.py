"""A Hugging Face ``transformers.TrainerCallback`` that reports metrics and
checkpoints through xp.

Importing this module imports ``transformers``; ``import xp`` alone never does.
Usage::

    from xp.integrations.huggingface import XpCallback, resume_checkpoint
    trainer = Trainer(..., callbacks=[XpCallback()])
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))

- Every log (``logging_steps``, evaluation) is reported at the trainer's global step.
- Every checkpoint the trainer saves (``save_steps``, ``save_strategy``) is
  handed to xp, which stores it; ``resume_checkpoint(output_dir)`` puts the
  checkpoint a resumed trial starts from back as ``output_dir/checkpoint-STEP``
  and returns that path (``None`` on a fresh start).
- When xp asks the trial to stop (preemption), the trainer saves a checkpoint at
  the end of the current step and stops; the trial resumes from it later.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import xp

__all__ = ["XpCallback", "resume_checkpoint"]

PREFIX = "checkpoint-"


def resume_checkpoint(output_dir: Union[str, "os.PathLike[str]"]) -> Optional[str]:
    """The checkpoint directory to pass as ``trainer.train(resume_from_checkpoint=...)``:
    the one xp restored for this attempt, copied to ``output_dir/checkpoint-STEP``;
    ``None`` on a fresh start."""
    step = xp.restore()
    if step is None:
        return None
    directory = Path(output_dir) / f"{PREFIX}{step}"
    xp.restore(directory)
    return str(directory)


class XpCallback(TrainerCallback):  # type: ignore[misc]
    """Reports the trainer's logs to xp, stores its checkpoints through xp and
    stops cleanly when xp preempts the trial."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        values = {
            name: float(value)
            for name, value in logs.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)
        }
        if values:
            xp.report(int(state.global_step), **values)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        directory = Path(args.output_dir) / f"{PREFIX}{state.global_step}"
        if state.is_world_process_zero and directory.is_dir():
            xp.checkpoint(int(state.global_step), directory)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self.stopping and xp.should_stop():
            self.stopping = True
            control.should_save = True
            control.should_training_stop = True
