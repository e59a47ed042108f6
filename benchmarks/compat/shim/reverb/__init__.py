"""A thin ``reverb`` package over shmreplay, for running Reverb's, Acme's and TF-Agents'
own tests unmodified (benchmarks/compat/run.py puts its parent first on sys.path).

Every name is shmreplay's own object; the shim only (a) lays shmreplay's modules out
under Reverb's module names and (b) maps ``host:PORT`` addresses onto buffer names
(``_ports``), which shmreplay does not do natively yet. Nothing else lives here: a
difference in behaviour is shmreplay's to fix, not the shim's.
"""

import sys

from reverb import _ports  # noqa: F401  (installs the address mapping first)
from reverb import (client, errors, item_selectors, rate_limiters, replay_sample, server,
                    structured_writer, trajectory_writer)

selectors = item_selectors
structured = structured_writer
from reverb.client import Client, Writer  # noqa: E402
from reverb.errors import DeadlineExceededError, ReverbError  # noqa: E402
from reverb.replay_sample import ReplaySample, SampleInfo  # noqa: E402
from reverb.server import Server, Table  # noqa: E402
from reverb.trajectory_writer import TrajectoryColumn, TrajectoryWriter  # noqa: E402

import shmreplay  # noqa: E402
from shmreplay import checkpointers  # noqa: E402

# TensorFlow-backed names load shmreplay.tf on first use, as shmreplay does.
_TF = {"TimestepDataset": "timestep_dataset", "TrajectoryDataset": "trajectory_dataset",
       "TFClient": "tf_client", "PatternDataset": "pattern_dataset"}


def __getattr__(name):
    if name in _TF:
        import importlib
        return getattr(importlib.import_module(f"reverb.{_TF[name]}"), name)
    raise AttributeError(f"module 'reverb' (shmreplay shim) has no attribute {name!r}")


del sys

__all__ = [
    "Client", "DeadlineExceededError", "ReplaySample", "ReverbError", "SampleInfo", "Server",
    "Table", "TrajectoryColumn", "TrajectoryWriter", "Writer", "checkpointers", "client",
    "errors", "item_selectors", "rate_limiters", "replay_sample", "selectors", "server",
    "shmreplay", "structured", "structured_writer", "trajectory_writer", "_ports",
]
