"""Actors on other nodes feed a buffer through Ray (``pip install shmreplay[ray]``).

On the buffer's node (where its owner, usually the learner, created it)::

    service = shmreplay.ray.BufferService(server)    # Ray actors on this node
    remote = service.client()                         # pass it to Ray tasks/actors

and in any Ray task or actor, on any node, ``remote`` has ``Client``'s calls:
``insert``, ``insert_batch``, ``trajectory_writer``, ``writer``, ``sample_batch``,
``mutate_priorities``, ``update_priorities`` and ``server_info``. See
docs/beyond-one-machine.md.
"""

try:
    import ray as _ray  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError("shmreplay.ray needs Ray: pip install 'shmreplay[ray]'") from _error

from shmreplay._ray.errors import BufferServiceUnavailableError
from shmreplay._ray.remote import BufferService, RemoteClient
from shmreplay._ray.column import RemoteColumn
from shmreplay._ray.writers import RemoteTrajectoryWriter, RemoteWriter

__all__ = ["BufferService", "BufferServiceUnavailableError", "RemoteClient", "RemoteColumn",
           "RemoteTrajectoryWriter", "RemoteWriter"]
