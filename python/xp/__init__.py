"""xp for Python: trial code and drivers for the xp experiment runtime.

Inside a trial (a command a node runs)::

    import xp
    cfg = xp.config()
    start = xp.restore("ckpt") or 0
    for step in range(start, 100):
        ...
        xp.report(step, loss=loss)
        if step % 10 == 0 or xp.should_stop():
            xp.checkpoint(step, "ckpt")
            if xp.should_stop():
                break

As a driver::

    with xp.Client() as client:            # XP_CLUSTER, or a join string
        run = client.submit("sweep.yaml")
        client.wait(run)
        print(client.results(run).to_pandas())

Everything that talks to the head or the node goes through ``xp._native``, the
Rust SDK built as an extension; outside a cluster the trial functions run
locally and say so once (see ``xp._trial``).
"""

from ._client import Client, Results, ResultRow, Submitted
from ._trial import (
    LocalRunWarning,
    attempt,
    checkpoint,
    checkpoint_dir,
    config,
    get,
    in_trial,
    put,
    rank,
    report,
    restore,
    seed,
    should_stop,
    world_size,
)
from .errors import (
    CheckpointError,
    ConnectError,
    NotFoundError,
    ObjectError,
    RemoteError,
    SpecError,
    WaitTimeout,
    XpError,
)

__all__ = [
    "Client",
    "Results",
    "ResultRow",
    "Submitted",
    "LocalRunWarning",
    "attempt",
    "checkpoint",
    "checkpoint_dir",
    "config",
    "get",
    "in_trial",
    "put",
    "rank",
    "report",
    "restore",
    "seed",
    "should_stop",
    "world_size",
    "CheckpointError",
    "ConnectError",
    "NotFoundError",
    "ObjectError",
    "RemoteError",
    "SpecError",
    "WaitTimeout",
    "XpError",
]
