"""``BufferService`` (the buffer-side actors, placed on the buffer's node) and
``RemoteClient`` (the calls of ``Client``, from any Ray task or actor on any node)."""

import threading
import time
import uuid
from typing import Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from shmreplay._client import address as _address
from shmreplay._ray.errors import BufferServiceUnavailableError
from shmreplay._ray.service import BufferActor
from shmreplay._ray.writers import RemoteTrajectoryWriter, RemoteWriter

_RemoteBufferActor = ray.remote(BufferActor)


class BufferService:
    """Ray actors on the buffer's node that serve one buffer to remote clients.

    Args:
      buffer: The buffer's name, or its ``shmreplay.Server``. The buffer must live on
        the node the actors are placed on (its owner, usually the learner, creates it).
      num_actors: How many actors serve the buffer (each remote writer sticks to one;
        inserts and samples of a remote client go to the one its thread picked).
      node_id: The Ray node to place them on; default: the node of the calling process.
      max_concurrency: Calls each actor runs at once (threads), so that an insert the
        rate limiter holds up does not hold up the others.
      max_restarts: How often Ray restarts a dead actor (-1: always). A restarted actor
        attaches to the buffer again by name; the buffer is not affected.
      retry_timeout: Seconds a remote call keeps retrying while its actor is dead or
        restarting, before ``BufferServiceUnavailableError``.
      start_timeout: Seconds to wait for the actors to start.
      ledger_directory: Where the ledger of applied chunks lives on the buffer's node
        (default ``/dev/shm``); ``stop()`` removes it.

    Call ``stop()`` (or use ``with``) before the buffer's owner stops the buffer.
    """

    def __init__(self, buffer, *, num_actors: int = 1, node_id: Optional[str] = None,
                 max_concurrency: int = 16, max_restarts: int = -1,
                 retry_timeout: float = 60.0, start_timeout: float = 120.0,
                 ledger_directory: Optional[str] = None):
        self.buffer_name = getattr(buffer, "name", buffer)
        if not isinstance(self.buffer_name, str):
            raise TypeError(f"buffer must be a name or a Server, got {buffer!r}.")
        _address.buffer_name(self.buffer_name)     # InvalidNameError here, not in an actor
        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {num_actors}.")
        self.node_id = node_id or ray.get_runtime_context().get_node_id()
        self._retry_timeout = float(retry_timeout)
        options = dict(
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_id, soft=False),
            num_cpus=0, max_restarts=max_restarts, max_task_retries=0,
            max_concurrency=max_concurrency)
        self.actors = [_RemoteBufferActor.options(**options).remote(self.buffer_name,
                                                                     ledger_directory)
                       for _ in range(num_actors)]
        try:
            ray.get([actor.ping.remote() for actor in self.actors], timeout=start_timeout)
        except BaseException:
            self.stop()
            raise

    def client(self, retry_timeout: Optional[float] = None) -> "RemoteClient":
        """A ``RemoteClient``: pass it to Ray tasks and actors (it pickles)."""
        return RemoteClient(self.actors, self.buffer_name,
                            self._retry_timeout if retry_timeout is None else retry_timeout)

    def stop(self):
        """Ends the actors (not the buffer) and removes the ledger. Idempotent."""
        actors, self.actors = getattr(self, "actors", []), []
        if actors:
            try:
                ray.get(actors[0].remove_ledger.remote(), timeout=10)
            except Exception:  # a dead actor: the ledger goes with Ray's session
                pass
        for actor in actors:
            ray.kill(actor, no_restart=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class RemoteClient:
    """``Client``'s calls from any Ray task or actor, on any node, through a
    ``BufferService``. Results are the local client's types; errors are the local
    client's errors, raised as such (``DeadlineExceededError``, ``BufferBrokenError``).

    Each process and thread has its own writer id for ``insert`` and ``insert_batch``,
    whose calls carry a sequence number: a call retried after the buffer-side actor
    died is applied once (see docs/beyond-one-machine.md).
    """

    def __init__(self, actors, buffer_name: str, retry_timeout: float = 60.0):
        if not actors:
            raise ValueError("RemoteClient needs at least one buffer-side actor.")
        self._actors = list(actors)
        self._name = buffer_name
        self._retry_timeout = float(retry_timeout)
        self._local = threading.local()

    def __reduce__(self):
        return (RemoteClient, (self._actors, self._name, self._retry_timeout))

    def __repr__(self):
        return f"RemoteClient({self._name!r}, actors={len(self._actors)})"

    @property
    def server_address(self) -> str:
        """The buffer's name."""
        return self._name

    def _actor_for(self, writer_id: str):
        return self._actors[int(writer_id[:8], 16) % len(self._actors)]

    def _sender(self):
        """This thread's ``[writer id, last seq, actor]``."""
        sender = getattr(self._local, "sender", None)
        if sender is None:
            writer_id = uuid.uuid4().hex
            sender = self._local.sender = [writer_id, 0, self._actor_for(writer_id)]
        return sender

    def _call(self, actor, method: str, *args):
        """Calls the actor; retries while it is dead or restarting (``retry_timeout``);
        raises the actor's error as itself."""
        deadline = time.monotonic() + self._retry_timeout
        delay = 0.05
        while True:
            try:
                return ray.get(getattr(actor, method).remote(*args))
            except ray.exceptions.RayTaskError as error:
                cause = getattr(error, "cause", None)
                if isinstance(cause, BaseException):
                    raise cause from None
                raise
            except ray.exceptions.RayActorError as error:
                if time.monotonic() + delay > deadline:
                    raise BufferServiceUnavailableError(
                        f"shmreplay.ray: no actor serving buffer {self._name!r} answered "
                        f"for {self._retry_timeout:g} s ({type(error).__name__}: {error})"
                    ) from error
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _submit(self, actor, method: str, *args):
        """Starts a call without waiting; ``_result`` waits for it."""
        return getattr(actor, method).remote(*args)

    def _result(self, ref, actor, method: str, *args):
        """The result of a ``_submit``: if the actor died meanwhile, the call is made
        again (and retried) with the same arguments, hence the same (writer id, seq)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        except ray.exceptions.RayActorError:
            return self._call(actor, method, *args)

    def _exactly_once(self, method: str, *args):
        sender = self._sender()
        sender[1] += 1
        return self._call(sender[2], method, sender[0], sender[1], *args)

    # --- Client's calls -------------------------------------------------------------------

    def insert(self, data, priorities, timeout: Optional[float] = None):
        """As ``Client.insert``; ``timeout`` bounds the wait for the rate limiter."""
        return self._exactly_once("insert", data, priorities, timeout)

    def insert_batch(self, data, priorities, timeout: Optional[float] = None):
        """As ``Client.insert_batch``: the ``B`` items go whole or not at all."""
        return self._exactly_once("insert_batch", data, priorities, timeout)

    def trajectory_writer(self, num_keep_alive_refs: int, *, chunk_items: int = 64,
                          max_chunk_steps: int = 1024, **unused) -> RemoteTrajectoryWriter:
        """A ``TrajectoryWriter`` whose steps are shipped in chunks of ``chunk_items``
        items (or ``max_chunk_steps`` steps), and at flush/end_episode."""
        return RemoteTrajectoryWriter(self, num_keep_alive_refs, chunk_items, max_chunk_steps)

    def writer(self, max_sequence_length: int, *, chunk_items: int = 64,
               max_chunk_steps: int = 1024, **unused) -> RemoteWriter:
        """Reverb's legacy ``Writer``, shipped in chunks as ``trajectory_writer``."""
        return RemoteWriter(self, max_sequence_length, chunk_items, max_chunk_steps)

    def sample_batch(self, table: str, batch_size: int, timeout: Optional[float] = None, *,
                     pad_to: Optional[int] = None):
        """As ``Client.sample_batch`` (the arrays may be read-only: Ray's zero-copy)."""
        return self._call(self._sender()[2], "sample_batch", table, batch_size, timeout,
                          pad_to)

    def mutate_priorities(self, table: str, updates=None, deletes=None):
        """As ``Client.mutate_priorities`` (idempotent: a retry changes nothing more)."""
        return self._call(self._sender()[2], "mutate_priorities", table, updates, deletes)

    def update_priorities(self, table: str, keys, priorities):
        """As ``Client.update_priorities``: how many keys were found and updated."""
        return self._call(self._sender()[2], "update_priorities", table, keys, priorities)

    def server_info(self, timeout: Optional[float] = None):
        """As ``Client.server_info``: ``{table name: TableInfo}``."""
        return self._call(self._sender()[2], "server_info", timeout)

    def close(self):
        """Nothing to release: the actors belong to the ``BufferService``."""
