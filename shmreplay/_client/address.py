"""Addresses: what ``Client(address)`` accepts, and how a port names a buffer.

There is no network listener. A Server created for port ``P`` (``Server(tables,
port=P)``, or ``Server(tables)``, which picks a free ``P``) is the buffer named
``port-P``, so ``"localhost:P"`` resolves to a name by arithmetic alone: no mapping
file that could outlive its owner, and the same ownership and mode checks as any
buffer name (``docs/security.md``). Ports form one machine-wide namespace, as TCP ports
do: ``port=None`` takes a free number by exclusive creation of the segment.
"""

import ipaddress
import random
import re
import socket
from typing import Optional

from shmreplay import errors
from shmreplay.table import validate_name

MAX_BUFFER_NAME = 100
PORT_PREFIX = "port-"
_PORT_NAME = re.compile(r"port-([1-9][0-9]{0,4})")
# Where port=None looks for a free number: Linux's default ephemeral range, as
# Reverb's portpicker does.
_FREE_PORTS = (32768, 60999)
# gRPC target forms a Reverb user may write before host:port.
_SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:")
_HOST = re.compile(r"localhost|\d{1,3}(\.\d{1,3}){3}")


def name_for_port(port) -> str:
    """The buffer name of ``port`` (``8000`` -> ``"port-8000"``).

    Raises:
      TypeError: if ``port`` is not an int.
      ValueError: if it is not in 1..65535.
    """
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"port must be an int or None, got {type(port).__name__} {port!r}.")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}.")
    return f"{PORT_PREFIX}{port}"


def port_of(name: str) -> Optional[int]:
    """The port a buffer name stands for (``"port-8000"`` -> 8000), or None."""
    match = _PORT_NAME.fullmatch(name)
    if match and int(match[1]) <= 65535:
        return int(match[1])
    return None


def free_port_candidates(count: int = 200):
    """Random port numbers for ``port=None`` to try, in order, until one is free."""
    return random.sample(range(_FREE_PORTS[0], _FREE_PORTS[1] + 1), count)


def buffer_name(address) -> str:
    """The buffer name ``address`` denotes.

    A buffer name stands for itself. A Reverb address, ``host:port`` in any form a
    gRPC target takes (``localhost:P``, ``127.0.0.1:P``, ``[::1]:P``,
    ``dns:///localhost:P``, ``ipv4:127.0.0.1:P``, this machine's host name), denotes
    the buffer of port ``P``.

    Raises:
      InvalidNameError: not a valid name or address, or the host is another machine.
    """
    try:
        return validate_name(address, "Buffer", MAX_BUFFER_NAME)
    except errors.InvalidNameError:
        if not (isinstance(address, str) and ":" in address):
            raise
    target = address
    for scheme in _SCHEMES:
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    host, _, port_text = target.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port_text.isdigit() or not host:
        raise errors.InvalidNameError(
            f"Client({address!r}): not a buffer name, nor an address 'host:port' with a "
            "numeric port. Pass the Server's name (server.name) or "
            "f'localhost:{server.port}'. `shmreplay ls` lists the buffers on this machine.")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise errors.InvalidNameError(f"Client({address!r}): port {port} is not in 1..65535.")
    if not is_this_machine(host):
        raise errors.InvalidNameError(
            f"Client({address!r}): {host!r} is not this machine. shmreplay buffers live in "
            "this machine's shared memory and are reached only from it (there is no "
            f"network server): use 'localhost:{port}', or run the client on that host.")
    return name_for_port(port)


def looks_like_host(name: str) -> bool:
    """Whether a (valid) buffer name is really a host without its port."""
    return bool(_HOST.fullmatch(name))


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine: a loopback or unspecified address,
    ``localhost``, or this machine's host name (never a DNS lookup of another host)."""
    lowered = host.lower().rstrip(".")
    if lowered in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        ip = ipaddress.ip_address(lowered)
    except ValueError:
        ip = None
    if ip is not None:
        return ip.is_loopback or ip.is_unspecified or _is_own_ip(str(ip))
    names = {socket.gethostname().lower()}
    names.add(next(iter(names)).split(".")[0])
    return lowered in names or lowered.split(".")[0] in names and _resolves_here(lowered)


def _is_own_ip(ip: str) -> bool:
    try:
        return ip in socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return False


def _resolves_here(host: str) -> bool:
    """A fully qualified name whose first label is this host's: believed if it
    resolves to a loopback address or one of this host's."""
    try:
        ips = socket.gethostbyname_ex(host)[2]
    except OSError:
        return False
    return any(ipaddress.ip_address(ip).is_loopback or _is_own_ip(ip) for ip in ips)
