"""``reverb.platform.checkpointers_lib``: the checkpointers under Reverb's module path.
The classes are ``shmreplay.checkpointers``' own (see that module)."""

from shmreplay.checkpointers import (CheckpointerBase, DefaultCheckpointer,
                                     TempDirCheckpointer, default_checkpointer)

__all__ = ["CheckpointerBase", "DefaultCheckpointer", "TempDirCheckpointer",
           "default_checkpointer"]
