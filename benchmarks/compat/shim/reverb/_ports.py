"""``host:PORT`` addresses as buffer names, for a shmreplay without native ports:
``Server(port=P)`` creates the buffer ``reverb-port-P`` and ``Client("localhost:P")``
attaches to it.

shmreplay takes Reverb's ``Server(tables, port, checkpointer)`` and local ``host:port``
addresses natively from issue 17 part 5 on; then (``NATIVE``) this module changes
nothing. Before that, it is the one place where the shim patches shmreplay: the function
that turns a Client's address into a buffer name.
"""

import inspect
import re

from shmreplay import client as _client
from shmreplay import server as _server

_ADDRESS = re.compile(r"(?:localhost|127\.0\.0\.1|\[::1\]|[A-Za-z0-9_.-]+):(\d+)")

# Reverb's positional order: Server(tables, port, checkpointer).
NATIVE = list(inspect.signature(_server.Server.__init__).parameters)[1:3] == ["tables", "port"]


def name_for_port(port: int) -> str:
    return f"reverb-port-{int(port)}"


def _as_name(address):
    if isinstance(address, bytes):
        address = address.decode()
    if isinstance(address, str):
        match = _ADDRESS.fullmatch(address)
        if match:
            return name_for_port(int(match.group(1)))
    return address


if not NATIVE and not getattr(_client._buffer_name, "_reverb_shim", False):
    _original = _client._buffer_name

    def _buffer_name(address):
        return _original(_as_name(address))

    _buffer_name._reverb_shim = True
    _client._buffer_name = _buffer_name
