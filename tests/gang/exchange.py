"""A two-rank command gang that talks to its peer as gloo and NCCL do.

Every step each rank sends a number to its peer over one TCP connection on
MASTER_ADDR:MASTER_PORT and waits for the peer's; both then update the same
value. A rank exits 1 as soon as its peer's connection drops. Rank 0 reports
`value` each step, checkpoints every step (waiting for the node's verdict)
and reports `final` at the end; a resumed attempt starts from the checkpoint.

Arguments: STEPS STEP_MS [FAIL_AT]: with FAIL_AT, every rank exits 1 before
that step (a fault of the trial's own code).
"""

import json
import os
import socket
import sys
import time

steps, step_ms = int(sys.argv[1]), int(sys.argv[2])
fail_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
rank = int(os.environ["XP_RANK"])
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
checkpoint_dir = os.environ["XP_CHECKPOINT_DIR"]
work_dir = os.environ["XP_WORK_DIR"]


def emit(kind, payload):
    print(kind, json.dumps(payload), flush=True)


def checkpoint(step, value):
    os.makedirs(checkpoint_dir, exist_ok=True)
    with open(os.path.join(checkpoint_dir, "state.json"), "w") as state:
        json.dump({"step": step, "value": value}, state)
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


def connect():
    if rank == 0:
        server = socket.create_server(("", master[1]))
        server.settimeout(60)
        peer, _ = server.accept()
        return peer
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection(master, timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                sys.exit("rank 0 never listened")
            time.sleep(0.1)


step, value = 0, 0.5
if os.environ.get("XP_RESUME_STEP"):
    with open(os.path.join(checkpoint_dir, "state.json")) as state:
        saved = json.load(state)
    step, value = saved["step"], saved["value"]
    print(f"resumed from step {step}", flush=True)

peer = connect()
peer.settimeout(None)
stream = peer.makefile("rwb")


def exchange(mine):
    try:
        stream.write(f"{mine}\n".encode())
        stream.flush()
        line = stream.readline()
    except OSError as error:
        sys.exit(f"peer connection failed: {error}")
    if not line:
        sys.exit("peer connection closed")
    return int(line)


while step < steps:
    if step == fail_at:
        sys.exit(f"failing at step {step}, as asked")
    step += 1
    mine = (step * (rank + 1)) % 7
    theirs = exchange(mine)
    value = value * 0.999 + (mine + theirs) / 1000
    if rank == 0:
        emit("XP_METRIC", {"step": step, "value": value})
        checkpoint(step, value)
    time.sleep(step_ms / 1000)
if rank == 0:
    emit("XP_METRIC", {"step": steps, "final": value})
