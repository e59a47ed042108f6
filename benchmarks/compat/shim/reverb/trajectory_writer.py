"""Reverb's ``reverb.trajectory_writer`` (shmreplay's module itself, private names
included, so that tests patching it patch shmreplay)."""

import sys

from shmreplay import trajectory_writer as _module

sys.modules[__name__] = _module
