"""The buffer-side actor: runs on the buffer's node, attaches to the buffer by name with
a local ``Client`` and applies what remote clients send.

Every mutating call carries ``(writer id, seq)``. The actor applies a chunk, records it
in the ledger (``ledger.py``) and answers; a chunk whose seq the ledger already holds is
answered from the ledger without being applied again. Writers' steps arrive in chunks
of operations (appends, item creations) that the actor replays on a local writer kept
per writer id; a chunk that starts where the local writer is not (a new or restarted
actor) is answered ``NEED_CONTEXT`` and resent with the writer's kept recent steps.
A chunk starts at ``(step, part)``: the episode's complete steps before it and the
parts (``partial_step=True`` appends) of the open step already appended.
"""

import pickle
import threading
from typing import Optional

from shmreplay import client as _client, specs
from shmreplay._client import address as _address
from shmreplay._ray.column import RemoteColumn
from shmreplay._ray.ledger import Ledger

NEED_CONTEXT = "need-context"
APPLIED = "applied"


class _WriterState:
    __slots__ = ("writer", "next_step", "parts", "pending_seq", "lock")

    def __init__(self, writer):
        self.writer = writer
        self.next_step = 0          # the episode's step index the next append gets
        self.parts = 0              # parts of that step appended (partial_step=True)
        self.pending_seq = None     # a chunk whose ops are applied but not yet flushed
        self.lock = threading.Lock()


def _resolve(history, column, end):
    """The local ``TrajectoryColumn`` for a ``RemoteColumn``; ``end`` is the history's
    length, the open step included (the column's steps are made relative to it)."""
    keys, squeeze = column.keys, column.squeeze
    steps = [step - end for step in column.steps]
    node = history
    for key in keys:
        node = node[key]
    if squeeze:
        return node[steps[0]]
    first, last = steps[0], steps[-1]
    if last - first + 1 == len(steps) and last < 0:  # consecutive: a slice
        return node[first:last + 1 if last < -1 else None]
    return node[list(steps)]


class BufferActor:
    """The Ray actor's class (``BufferService`` makes it a Ray actor)."""

    def __init__(self, buffer_name: str, ledger_directory: Optional[str] = None):
        self._name = buffer_name
        self._client = _client.Client(buffer_name)        # lazy: waits for the buffer
        # Named by the buffer's own name ("localhost:P" is "port-P"), as `shmreplay gc`
        # finds the buffer of a ledger.
        self._ledger = Ledger(_address.buffer_name(buffer_name), ledger_directory)
        self._writers = {}
        self._writers_lock = threading.Lock()
        self._die_after_apply = False

    # --- simple calls -------------------------------------------------------------------

    def ping(self):
        import os
        import ray
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def server_info(self, timeout):
        return self._client.server_info(timeout)

    def sample_batch(self, table, batch_size, timeout, pad_to):
        return self._client.sample_batch(table, batch_size, timeout, pad_to=pad_to)

    def mutate_priorities(self, table, updates, deletes):
        return self._client.mutate_priorities(table, updates, deletes)

    def update_priorities(self, table, keys, priorities):
        return self._client.update_priorities(table, keys, priorities)

    # --- exactly-once calls -------------------------------------------------------------

    def _done(self, writer_id, seq):
        last = self._ledger.last(writer_id)
        if last is not None and seq <= last[0]:
            if seq < last[0]:
                raise RuntimeError(f"shmreplay.ray: chunk {seq} of writer {writer_id} is "
                                   f"older than its last applied chunk ({last[0]}).")
            return True, last[1]
        return False, None

    def _applied(self, writer_id, seq, result):
        self._ledger.record(writer_id, seq, result)
        if self._die_after_apply:          # tests: the reply is lost, the actor restarts
            import os
            os._exit(1)
        return result

    def insert(self, writer_id, seq, data, priorities, timeout):
        done, result = self._done(writer_id, seq)
        if done:
            return result
        keys = self._client.insert(data, priorities, timeout)
        return self._applied(writer_id, seq, keys)

    def insert_batch(self, writer_id, seq, data, priorities, timeout):
        done, result = self._done(writer_id, seq)
        if done:
            return result
        keys = self._client.insert_batch(data, priorities, timeout)
        return self._applied(writer_id, seq, keys)

    def apply_chunk(self, writer_id, seq, kind, config, first_step, context, ops,
                    end_episode, timeout):
        """Applies a writer's chunk: ``ops`` from step ``first_step`` of its episode.

        ``first_step`` is ``(step, part)`` (an int: part 0); ``context`` the parts
        ``(data, partial)`` of the kept steps before it. Returns ``APPLIED``, or
        ``NEED_CONTEXT`` when this actor's writer is not at ``first_step`` and no
        ``context`` came along.
        """
        first = tuple(first_step) if isinstance(first_step, (tuple, list)) \
            else (first_step, 0)
        if type(ops) is bytes:   # the remote writers send their ops pickled, in one piece
            ops = pickle.loads(ops)
        done, result = self._done(writer_id, seq)
        if done:
            return result
        with self._writers_lock:
            state = self._writers.get(writer_id)
        if state is not None and state.pending_seq == seq:
            with state.lock:   # a retry of a chunk that waited for the rate limiter
                return self._finish(writer_id, seq, state, end_episode, timeout)
        if state is None or (state.next_step, state.parts) != first \
                or state.pending_seq is not None:
            if first != (0, 0) and context is None:
                return NEED_CONTEXT
            if state is not None:
                state.writer.close()     # items it still held were never acknowledged
            state = _WriterState(self._new_writer(kind, config))
            with self._writers_lock:
                self._writers[writer_id] = state
            if first != (0, 0):
                for data, partial in context:
                    state.writer.append(data, **({"partial_step": True} if partial else {}))
            state.next_step, state.parts = first
        with state.lock:
            writer = state.writer
            for op in ops:
                if op[0] == "a":
                    writer.append(op[1])
                    state.next_step += 1
                    state.parts = 0
                elif op[0] == "p":
                    writer.append(op[1], partial_step=True)
                    state.parts += 1
                elif kind == "trajectory":
                    _, table, priority, trajectory = op
                    history = writer.history
                    end = state.next_step + (1 if state.parts else 0)  # the history's length
                    if type(trajectory) is dict and all(
                            type(column) is RemoteColumn for column in trajectory.values()):
                        local = {key: _resolve(history, column, end)
                                 for key, column in trajectory.items()}
                    else:
                        local = specs.optree.tree_map(
                            lambda column: _resolve(history, column, end), trajectory)
                    writer.create_item(table, priority, local)
                else:
                    _, table, num_timesteps, priority = op
                    writer.create_item(table, num_timesteps, priority)
            state.pending_seq = seq
            return self._finish(writer_id, seq, state, end_episode, timeout)

    def _new_writer(self, kind, config):
        if kind == "trajectory":
            return self._client.trajectory_writer(config["num_keep_alive_refs"])
        return self._client.writer(config["max_sequence_length"])

    def _finish(self, writer_id, seq, state, end_episode, timeout):
        writer = state.writer
        if hasattr(writer, "end_episode"):
            writer.flush(0, None if timeout is None else int(timeout * 1000))
            if end_episode:
                writer.end_episode()
        else:
            writer.flush(timeout)
            if end_episode:
                writer.close()
                with self._writers_lock:
                    self._writers.pop(writer_id, None)
        if end_episode:
            state.next_step = state.parts = 0
        state.pending_seq = None
        return self._applied(writer_id, seq, APPLIED)

    def close_writer(self, writer_id):
        with self._writers_lock:
            state = self._writers.pop(writer_id, None)
        if state is not None:
            state.writer.close()
        self._ledger.forget(writer_id)

    # --- service ------------------------------------------------------------------------

    def _test_die_after_next_apply(self):
        """Tests only: the next applied call exits the process before it answers."""
        self._die_after_apply = True

    def remove_ledger(self):
        self._ledger.remove_all()

    def close(self):
        self._client.close()

