"""A buffer for one test: ``with serve(*tables) as (name, client)``, stopped after it."""

import contextlib

import shmreplay
import _names


@contextlib.contextmanager
def serve(*tables):
    """A Server of ``tables`` under a fresh name, and a Client attached to it."""
    with shmreplay.Server(list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield server.name, client
        finally:
            client.close()
