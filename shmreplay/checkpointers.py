"""Where checkpoints go and which one a Server restores (Reverb's ``checkpointers``).

A checkpointer is a directory: ``Client.checkpoint()`` writes a new file there, named
by its UTC time, and removes the older ones (Reverb keeps only the latest too). A
``Server`` given a checkpointer restores the newest complete checkpoint in it, or else
its ``fallback_checkpoint_path``, or else starts empty::

    checkpointer = shmreplay.checkpointers.DefaultCheckpointer("/data/replay")
    server = shmreplay.Server(tables, name="replay", checkpointer=checkpointer)
    ...
    path = shmreplay.Client("replay").checkpoint()   # /data/replay/20261122T154501.123456Z.shmreplay

Checkpoints can also be written to and restored from explicit files:
``Client.checkpoint(path)`` and ``Server(..., checkpoint=path)``.
"""

import datetime
import os
import re
import stat
import tempfile
from typing import Optional

SUFFIX = ".shmreplay"


class CheckpointerBase:
    """A directory of checkpoints. Subclasses choose the directory."""

    def __init__(self, path: str, group: str = "",
                 fallback_checkpoint_path: Optional[str] = None):
        self.path = os.path.abspath(path)
        self.group = group  # accepted for Reverb compatibility; permissions come from
        #                    the directory
        self.fallback_checkpoint_path = fallback_checkpoint_path

    def new_checkpoint_path(self) -> str:
        """A fresh file name in the directory, later than every existing one."""
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        path = os.path.join(self.path, stamp + SUFFIX)
        latest = self.latest()
        if latest is not None and os.path.basename(latest) >= os.path.basename(path):
            # The clock went backwards (or two checkpoints in one microsecond): stay sorted.
            path = latest[:-len(SUFFIX)] + "_1" + SUFFIX
        return path

    def latest(self) -> Optional[str]:
        """The newest checkpoint in the directory, or None."""
        return latest_in(self.path)

    def path_to_restore(self) -> Optional[str]:
        """What a Server restores: the latest checkpoint, else the fallback, else None."""
        return self.latest() or self.fallback_checkpoint_path

    def remove_older_than(self, keep: str):
        """Deletes the directory's checkpoints older than ``keep`` (only ours, by suffix)."""
        for name in _checkpoint_names(self.path):
            path = os.path.join(self.path, name)
            if name < os.path.basename(keep):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r})"


class DefaultCheckpointer(CheckpointerBase):
    """Checkpoints in ``path`` (created by the first checkpoint if missing).

    Args:
      path: The directory.
      group: Accepted for Reverb compatibility, unused.
      fallback_checkpoint_path: A checkpoint file (or directory of checkpoints) to
        restore when ``path`` holds none yet, e.g. to start from another run's data.
    """


class TempDirCheckpointer(DefaultCheckpointer):
    """Checkpoints in a new private temporary directory (Reverb's default)."""

    def __init__(self, group: str = "", fallback_checkpoint_path: Optional[str] = None):
        super().__init__(tempfile.mkdtemp(prefix="shmreplay-checkpoints-"), group,
                         fallback_checkpoint_path)


def default_checkpointer(group: Optional[str] = None) -> TempDirCheckpointer:
    """Reverb's ``default_checkpointer``: a ``TempDirCheckpointer``."""
    return TempDirCheckpointer(group or "")


def private_temporary_directory(buffer_name: str) -> str:
    """Where ``Client.checkpoint()`` writes for a Server without a checkpointer.

    ``$TMPDIR/shmreplay-checkpoints-UID/BUFFER``: one directory per buffer, so every
    process finds the same one and only the newest checkpoint is kept, inside a
    directory of this user's that nobody else may enter (mode 0700). The name is
    predictable, so a directory of that name that is not ours, is a symlink or is open
    to others is refused rather than used.

    Raises:
      PermissionError: if that directory exists and is not private to this user.
    """
    base = os.path.join(tempfile.gettempdir(), f"shmreplay-checkpoints-{os.getuid()}")
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(base)
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or info.st_mode & 0o077):
        raise PermissionError(
            f"{base} is not a directory private to this user (owner uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}); remove it, or give Client.checkpoint a path.")
    directory = os.path.join(base, buffer_name)
    os.makedirs(directory, 0o700, exist_ok=True)
    return directory


def latest_in(directory: str) -> Optional[str]:
    """The newest checkpoint file in ``directory`` (by name), or None."""
    names = _checkpoint_names(directory)
    return os.path.join(directory, max(names)) if names else None


# The names ``new_checkpoint_path`` gives: UTC time, then ``_1`` per clash. Only these
# count as a directory's checkpoints, so a file the user named in the same directory is
# never taken for the newest one, nor deleted as an older one.
_NAME = re.compile(r"[0-9]{8}T[0-9]{6}\.[0-9]{6}Z(_1)*" + re.escape(SUFFIX))


def _checkpoint_names(directory: str):
    try:
        return [n for n in os.listdir(directory) if _NAME.fullmatch(n)]
    except FileNotFoundError:
        return []
