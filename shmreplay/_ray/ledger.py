"""The ledger: for each writer id, the last chunk applied (its sequence number and the
result returned for it), kept so that a retried chunk is answered, not applied again.

It lives in memory and, so that it outlives a restart of the buffer-side actor, in one
small file per writer on the buffer's node (replaced atomically, written after the
chunk's items were committed), in ``/dev/shm/shmreplay-ray-ledger.<buffer>/`` (a
memory file system: about 0.1 ms a chunk, where a disk's /tmp took 2 ms here).
``BufferService.stop`` removes it; ``shmreplay gc`` removes one whose buffer is gone
(``ledgers`` and ``remove_directory`` below: no Ray needed).
"""

import os
import pickle
import tempfile
import threading


PREFIX = "shmreplay-ray-ledger."


def _base_directory():
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def ledgers(directory: str):
    """``{buffer name: path}`` of the ledger directories in ``directory`` (``/dev/shm``
    for the default ``ledger_directory``): real directories named ``PREFIX<buffer>``."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return {}
    found = {}
    for entry in sorted(entries):
        path = os.path.join(directory, entry)
        if entry.startswith(PREFIX) and len(entry) > len(PREFIX) \
                and os.path.isdir(path) and not os.path.islink(path):
            found[entry[len(PREFIX):]] = path
    return found


def ledger_files(path: str):
    """``(files, bytes)`` of a ledger directory (``(0, 0)`` if it went meanwhile)."""
    count = size = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    count += 1
                    size += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return count, size


def remove_directory(path: str):
    """Removes a ledger directory and its files. Returns the files removed.

    Raises:
      OSError: the directory holds something else than files (left as it is, with it),
        or may not be removed by this user.
    """
    removed = 0
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
                removed += 1
            except FileNotFoundError:
                pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    return removed


class Ledger:
    """``{writer id: (last applied seq, its result)}``, in memory and on disk."""

    def __init__(self, buffer_name: str, directory=None):
        self.directory = os.path.join(directory or _base_directory(),
                                      f"{PREFIX}{buffer_name}")
        os.makedirs(self.directory, exist_ok=True)
        self._memory = {}
        self._lock = threading.Lock()

    def _path(self, writer_id: str) -> str:
        if not writer_id.isalnum():
            raise ValueError(f"bad writer id {writer_id!r}")
        return os.path.join(self.directory, writer_id)

    def last(self, writer_id: str):
        """``(seq, result)`` of the writer's last applied chunk, or None."""
        with self._lock:
            entry = self._memory.get(writer_id)
        if entry is not None:
            return entry
        try:
            with open(self._path(writer_id), "rb") as file:
                entry = pickle.load(file)
        except FileNotFoundError:
            return None
        with self._lock:
            self._memory.setdefault(writer_id, entry)
        return entry

    def record(self, writer_id: str, seq: int, result):
        entry = (seq, result)
        path = self._path(writer_id)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}"
        try:
            self._write(temporary, path, entry)
        except FileNotFoundError:
            # ``shmreplay gc`` removed the directory while the buffer did not exist (a
            # service started before its buffer, or one whose buffer was stopped).
            os.makedirs(self.directory, exist_ok=True)
            self._write(temporary, path, entry)
        with self._lock:
            self._memory[writer_id] = entry

    @staticmethod
    def _write(temporary, path, entry):
        # os-level calls: no file object (a third less time than open()/pickle.dump)
        data = memoryview(pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        os.replace(temporary, path)   # whole or not at all

    def forget(self, writer_id: str):
        with self._lock:
            self._memory.pop(writer_id, None)
        try:
            os.unlink(self._path(writer_id))
        except FileNotFoundError:
            pass

    def remove_all(self):
        """Removes the buffer's ledger directory (``BufferService.stop``)."""
        with self._lock:
            self._memory.clear()
        try:
            remove_directory(self.directory)
        except OSError:   # something else was put in it: left as it is
            pass
