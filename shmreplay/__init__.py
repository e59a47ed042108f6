"""shmreplay: shared-memory experience replay with DeepMind Reverb's client API.

Create a buffer in one process, attach to it by name from any other process of the same
user, insert and sample at memory speed::

    import shmreplay
    from shmreplay import selectors, rate_limiters

    server = shmreplay.Server([shmreplay.Table(
        "replay", sampler=selectors.Prioritized(0.6), remover=selectors.Fifo(),
        max_size=100_000, rate_limiter=rate_limiters.MinSize(1_000))], name="my-buffer")
    client = shmreplay.Client("my-buffer")        # from any process

Importing this package loads no TensorFlow, JAX or numba and compiles nothing. The
first ``Server`` created after an install compiles the numba kernels, once for the
machine (``warm_up``; numba caches them on disk). The TensorFlow and JAX adapters are
the modules ``shmreplay.tf`` and ``shmreplay.jax``, imported only when asked for.
"""

from shmreplay import errors, rate_limiters, selectors
from shmreplay.errors import DeadlineExceededError, ShmReplayError
from shmreplay.replay_sample import PaddedSample, ReplaySample, SampleInfo, TableInfo
from shmreplay.specs import TensorSpec
from shmreplay.table import Table

__version__ = "0.1.0"  # the one place: setup.cfg reads it (attr:)

# Reverb's name for the base of its errors, so ``except reverb.ReverbError`` keeps working
# after ``import shmreplay as reverb``.
ReverbError = ShmReplayError

# Names whose modules load numba (or TensorFlow) are imported on first use, so that
# ``import shmreplay`` and the ``shmreplay`` command start fast; ``from shmreplay import
# Client`` works as usual. Reverb's datasets live at the top level, as in Reverb.
_LAZY = {
    "Client": "shmreplay.client",
    "Server": "shmreplay.server",
    "TrajectoryColumn": "shmreplay.trajectory_writer",
    "TrajectoryWriter": "shmreplay.trajectory_writer",
    "Writer": "shmreplay.writer",
    "checkpointers": None,
    "platform": None,
    "structured_writer": None,
    "warm_up": "shmreplay._ops.warmup",
    "TFClient": "shmreplay.tf",
    "PatternDataset": "shmreplay.tf",
    "TimestepDataset": "shmreplay.tf",
    "TrajectoryDataset": "shmreplay.tf",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'shmreplay' has no attribute {name!r}")
    import importlib
    module = _LAZY[name]
    if module is None:  # a submodule
        return importlib.import_module(f"shmreplay.{name}")
    value = getattr(importlib.import_module(module), name)
    if not module.endswith(".tf"):  # TF's stay lazy: shmreplay.tf may fail to import
        globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Client", "DeadlineExceededError", "PaddedSample", "ReplaySample", "ReverbError", "SampleInfo", "Server",
    "ShmReplayError", "Table", "TableInfo", "TensorSpec", "TrajectoryColumn",
    "TrajectoryWriter", "Writer", "checkpointers", "errors", "platform", "rate_limiters",
    "selectors", "warm_up",
]
