"""Reverb's ``reverb.server``: ``Server(tables, port=None, checkpointer=None)`` and
``Table``. shmreplay's own Server where it takes ports (``_ports.NATIVE``); otherwise a
subclass that names the buffer after the port (see ``_ports``)."""

import os
import random

from shmreplay import server as _server
from shmreplay.table import Table  # noqa: F401

from reverb import _ports

_RANDOM = random.SystemRandom()  # tests seed `random`; ports must still differ


def _pick_port():
    for _ in range(1000):
        port = _RANDOM.randint(20000, 60000)
        if not os.path.exists(f"/dev/shm/shmreplay.{_ports.name_for_port(port)}"):
            return port
    raise RuntimeError("no free port number")


class _PortServer(_server.Server):
    def __init__(self, tables=None, port=None, checkpointer=None):
        self._reverb_port = _pick_port() if port is None else int(port)
        super().__init__(tables, name=_ports.name_for_port(self._reverb_port),
                         checkpointer=checkpointer)

    @property
    def port(self):
        return self._reverb_port


Server = _server.Server if _ports.NATIVE else _PortServer

__all__ = ["Server", "Table"]
