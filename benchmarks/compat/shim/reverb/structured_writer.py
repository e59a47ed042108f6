"""Reverb's ``reverb.structured_writer`` (shmreplay's module itself)."""

import sys

from shmreplay import structured_writer as _module

sys.modules[__name__] = _module
