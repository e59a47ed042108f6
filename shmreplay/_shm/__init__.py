"""The shared-memory layer: bytes, segments, locks and processes.

``layout`` (every byte offset), ``segment`` (POSIX shared memory), ``sync`` (the locking
protocol), ``procs`` (liveness), ``lock_waits`` (a busy lock, with a limit), ``peek``
(reading a header without trusting it), ``termination`` (SIGTERM in native waits),
``crash_points`` (tests only), and ``kernels/`` (the numba code that runs on it).
Nothing here knows tables' items, writers or clients.
"""
