"""PyTorch DistributedDataParallel over gloo as an xp command gang.

A linear model fitted by SGD on a fixed data set: each step every rank takes
its share of a global batch of 16, gloo averages the gradients, rank 0
reports the loss and checkpoints the model, the optimizer and the step every
step (waiting for the node's verdict), and at the end reports every
parameter. A resumed attempt starts from the checkpoint, so a run that lost
a node ends with the parameters of one that did not.

Arguments: STEPS STEP_MS.
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

steps, step_ms = int(sys.argv[1]), int(sys.argv[2])
rank, world = int(os.environ["XP_RANK"]), int(os.environ["XP_WORLD_SIZE"])
checkpoint_dir = os.environ["XP_CHECKPOINT_DIR"]
work_dir = os.environ["XP_WORK_DIR"]
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


def emit(kind, payload):
    print(kind, json.dumps(payload), flush=True)


def checkpoint(step, model, optimizer):
    os.makedirs(checkpoint_dir, exist_ok=True)
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, os.path.join(checkpoint_dir, "state.pt"))
    verdict = os.path.join(work_dir, ".checkpoint-status", str(step))
    emit("XP_CHECKPOINT", {"step": step})
    deadline = time.monotonic() + 60
    while not os.path.exists(verdict):
        if time.monotonic() > deadline:
            sys.exit(f"no verdict on the checkpoint of step {step}")
        time.sleep(0.02)
    with open(verdict) as answer:
        text = answer.read()
    if not text.startswith("stored:"):
        sys.exit(f"checkpoint of step {step}: {text}")


dist.init_process_group(
    "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1)
inputs = torch.randn(256, 8, generator=data)
targets = inputs @ torch.arange(8.0).unsqueeze(1) * 0.1
step = 0
if os.environ.get("XP_RESUME_STEP"):
    state = torch.load(os.path.join(checkpoint_dir, "state.pt"))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"resumed from step {step}", flush=True)
ddp = DistributedDataParallel(model)
while step < steps:
    batch = torch.arange(step * 16 + rank, step * 16 + 16, world) % 256
    loss = torch.nn.functional.mse_loss(ddp(inputs[batch]), targets[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if rank == 0:
        emit("XP_METRIC", {"step": step, "loss": loss.item()})
        checkpoint(step, model, optimizer)
    time.sleep(step_ms / 1000)
if rank == 0:
    values = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    emit("XP_METRIC", {"step": steps, **{f"p{i}": float(v) for i, v in enumerate(values)}})
dist.destroy_process_group()
