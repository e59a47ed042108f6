"""A checkpoint finishes while inserts outrun its preparation.

A snapshot prepares (allocates and touches) room for the table's items before it takes
the table's lock; if more items arrived meanwhile than its margin allows, it prepares
again. With a fixed margin, a steady stream of inserts faster than the preparation kept
it retrying until the inserts stopped or the table was full. The margin now doubles on
each attempt.
"""

import os

import numpy as np

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay._engine import snapshot as _snapshot


def test_a_snapshot_outruns_inserts_that_outrun_its_preparation(buffer_name, tmp_path,
                                                                 monkeypatch):
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 500_000,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        actor = shmreplay.Client(server.name)
        try:
            client.insert_batch(np.zeros((100, 2), np.float32), {"t": 1.0}, timeout=5)
            attempts = []
            prepare = _snapshot._Outputs

            def prepare_while_an_actor_inserts(engine, room, rows_room):
                attempts.append(room)
                if len(attempts) <= 40:  # more than the margin, every time
                    for _ in range(4):
                        actor.insert_batch(np.ones((1000, 2), np.float32), {"t": 1.0},
                                           timeout=5)
                return prepare(engine, room, rows_room)

            monkeypatch.setattr(_snapshot, "_Outputs", prepare_while_an_actor_inserts)
            path = client.checkpoint(os.path.join(tmp_path, "c.ckpt"))
            assert len(attempts) <= 5, attempts
            monkeypatch.undo()
            with shmreplay.Server(name=buffer_name + "-r", checkpoint=path) as restored:
                size = restored.localhost_client().server_info()["t"].current_size
            assert size == 100 + 4000 * len(attempts)
        finally:
            actor.close()
            client.close()
