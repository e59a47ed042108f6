"""Reverb's ``reverb.tf_client``: shmreplay's TFClient where this checkout has one (an
ImportError otherwise, which fails tf_client_test.py at import)."""

from shmreplay.tf import TFClient  # noqa: F401

from reverb import _ports  # noqa: F401

__all__ = ["TFClient", "_ports"]
