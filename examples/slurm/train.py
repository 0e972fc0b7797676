#!/usr/bin/env python3
"""A stand-in training loop for the Slurm examples, in plain Python.

It speaks xp's worker contract with nothing but the standard library: it reads
its parameters from XP_CONFIG, reports `XP_METRIC` lines, checkpoints into
XP_CHECKPOINT_DIR (and waits for the node's verdict, as the SDK does), resumes
from a checkpoint the node restored (XP_RESUME_STEP), and on SIGTERM (a
preemption, or the node draining because its Slurm job ends) saves where it is
and exits 143, so the trial moves to another node and loses no work.

Parameters: steps (default 20), step_seconds (0.5), lr (0.1), every (5: a
checkpoint every that many steps).
"""

import json
import os
import signal
import sys
import time

stop_requested = False


def on_sigterm(_signum, _frame):
    global stop_requested
    stop_requested = True


signal.signal(signal.SIGTERM, on_sigterm)

config = json.loads(os.environ.get("XP_CONFIG", "{}"))
steps = int(config.get("steps", 20))
step_seconds = float(config.get("step_seconds", 0.5))
lr = float(config.get("lr", 0.1))
every = max(1, int(config.get("every", 5)))
attempt = int(os.environ.get("XP_ATTEMPT", "1"))
checkpoint_dir = os.environ.get("XP_CHECKPOINT_DIR")
work_dir = os.environ.get("XP_WORK_DIR", ".")


def emit(prefix, payload):
    print(f"{prefix} {json.dumps(payload)}", flush=True)


def checkpoint(step, loss):
    """Writes the state and waits (at most a minute) until the node stored it."""
    if not checkpoint_dir:
        return
    os.makedirs(checkpoint_dir, exist_ok=True)
    with open(os.path.join(checkpoint_dir, "state.json"), "w") as state:
        json.dump({"step": step, "loss": loss}, state)
    verdict = os.path.join(work_dir, ".checkpoint-status", str(step))
    if os.path.exists(verdict):
        os.remove(verdict)
    emit("XP_CHECKPOINT", {"step": step})
    deadline = time.monotonic() + 60
    while not os.path.exists(verdict):
        if time.monotonic() > deadline:
            sys.exit(f"the node did not store the checkpoint of step {step} within a minute")
        time.sleep(0.05)
    with open(verdict) as answer:
        text = answer.read()
    if not text.startswith("stored:"):
        sys.exit(f"checkpoint at step {step} not stored: {text}")


print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
step, loss = 0, 1.0
if os.environ.get("XP_RESUME_STEP") and checkpoint_dir:
    with open(os.path.join(checkpoint_dir, "state.json")) as state:
        saved = json.load(state)
    step, loss = int(saved["step"]), float(saved["loss"])
    print(f"resumed from step {step} (attempt {attempt})", flush=True)

while step < steps:
    if stop_requested:
        checkpoint(step, loss)
        print(f"stopped at step {step}: checkpointed, exiting", flush=True)
        sys.exit(143)
    step += 1
    loss *= 1.0 - lr
    emit("XP_METRIC", {"step": step, "loss": loss, "attempt": attempt})
    if step % every == 0:
        checkpoint(step, loss)
    time.sleep(step_seconds)

emit("XP_METRIC", {"step": steps, "final_loss": loss})
