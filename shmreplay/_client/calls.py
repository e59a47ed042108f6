"""How a ``Client`` call survives what happens under it: a table's layout forgotten
(``Client.reset``) is checked again and the call retried; a Client closed by another
thread turns whatever the call tripped on into ``ClosedError``."""

import functools

from shmreplay import errors

LAYOUT_RETRIES = 5


def after_layout_reset(call, *args):
    """``call(*args)``, again if a table's layout is forgotten under it (the call
    starts afresh: checks and plans made for the old layout are dropped)."""
    for attempt in range(LAYOUT_RETRIES):
        try:
            return call(*args)
        except errors.LayoutResetError:
            if attempt == LAYOUT_RETRIES - 1:
                raise


def raise_if_closed(closed: bool, name: str, exc: Exception):
    """Raises ``ClosedError`` instead of ``exc`` if the Client of buffer ``name`` was
    closed meanwhile (by another thread: the views ``exc`` tripped on were dropped under
    the call)."""
    if closed and not isinstance(exc, errors.ClosedError):
        raise errors.ClosedError(
            f"Client for '{name}' was closed (by another thread) during this call.") from exc


def retried_after_layout_reset(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return after_layout_reset(lambda: method(self, *args, **kwargs))
        except Exception as exc:
            self._raise_if_closed(exc)
            raise
    return call


def closed_aware(method):
    """``ClosedError`` for a call that another thread's ``close()`` cut short."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            self._raise_if_closed(exc)
            raise
    return call
