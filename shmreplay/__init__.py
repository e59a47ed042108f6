"""shmreplay: shared-memory experience replay with DeepMind Reverb's client API.

Create a buffer in one process, attach to it by name from any other process of the same
user, insert and sample at memory speed::

    import shmreplay
    from shmreplay import selectors, rate_limiters

    server = shmreplay.Server([shmreplay.Table(
        "replay", sampler=selectors.Prioritized(0.6), remover=selectors.Fifo(),
        max_size=100_000, rate_limiter=rate_limiters.MinSize(1_000))], name="my-buffer")
    client = shmreplay.Client("my-buffer")        # from any process

Importing this package loads no TensorFlow or JAX and compiles nothing (kernels compile
on first use and are cached on disk). The TensorFlow and JAX adapters are the modules
``shmreplay.tf`` and ``shmreplay.jax``, imported only when asked for.
"""

from shmreplay import checkpointers, errors, rate_limiters, selectors
from shmreplay.client import Client
from shmreplay.errors import DeadlineExceededError, ShmReplayError
from shmreplay.replay_sample import ReplaySample, SampleInfo, TableInfo
from shmreplay.server import Server
from shmreplay.specs import TensorSpec
from shmreplay.table import Table
from shmreplay.trajectory_writer import TrajectoryColumn, TrajectoryWriter
from shmreplay.writer import Writer

__version__ = "0.1.0"

# Reverb's name for the base of its errors, so ``except reverb.ReverbError`` keeps working
# after ``import shmreplay as reverb``.
ReverbError = ShmReplayError

# Reverb's datasets, at the top level as in Reverb; they need TensorFlow, so they are
# imported from ``shmreplay.tf`` on first use, not with this package.
_FROM_TF = ("TimestepDataset", "TrajectoryDataset")


def __getattr__(name):
    if name in _FROM_TF:
        from shmreplay import tf
        return getattr(tf, name)
    raise AttributeError(f"module 'shmreplay' has no attribute {name!r}")

__all__ = [
    "Client", "DeadlineExceededError", "ReplaySample", "ReverbError", "SampleInfo", "Server",
    "ShmReplayError", "Table", "TableInfo", "TensorSpec", "TrajectoryColumn",
    "TrajectoryWriter", "Writer", "checkpointers", "errors", "rate_limiters", "selectors",
]
