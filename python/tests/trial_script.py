"""A Python trial for the tests: sums its steps, checkpointing its running sum
with xp every few steps and whenever xp asks it to stop, and resumes from it.

Reports ``total`` every step, ``resumed_from`` (the step restored, -1 on a fresh
start) once per attempt, and ``final`` at the end.
"""

import json
import os
import sys
import time
from pathlib import Path

import xp

cfg = xp.config()
# The parameters arrive typed as given in the spec.
assert isinstance(cfg["steps"], int) and not isinstance(cfg["steps"], bool), cfg
assert isinstance(cfg["pause"], float), cfg
assert isinstance(cfg["label"], str), cfg
assert xp.rank() == 0 and xp.world_size() == 1
assert isinstance(xp.seed(), int)

state = Path(os.environ["XP_WORK_DIR"]) / "my-state"
restored = xp.restore(state)
if restored is None:
    total, first = 0, 0
else:
    total = json.loads((state / "sum.json").read_text())["total"]
    first = restored + 1
print(f"attempt {xp.attempt()} starts at step {first}", flush=True)
xp.report(first, resumed_from=-1 if restored is None else restored)


def save(step: int) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "sum.json").write_text(json.dumps({"total": total}))
    xp.checkpoint(step, state)


for step in range(first, cfg["steps"]):
    total += step
    xp.report(step, total=total)
    if xp.should_stop():
        save(step)
        print(f"stopping at step {step}", flush=True)
        # Returning normally after a stop request exits 143, not 0.
        sys.exit(0)
    if step % cfg["every"] == 0:
        save(step)
    time.sleep(cfg["pause"])
xp.report(cfg["steps"], final=total)
