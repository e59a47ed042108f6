"""Cross-process synchronization: the locking protocol lives in this file.

The protocol
------------
* **One lock per table**: a process-shared, *robust* pthread mutex stored in the first
  64 bytes of the table's ``ctrl`` array. It guards all table metadata (slot states,
  keys, priorities, sum-trees, heaps, lists, counters). It is taken and released only
  inside the jitted entry points of ``shmreplay._shm.kernels.table`` (one native call per
  operation, no Python between lock and unlock), never around a bulk data copy, and
  never together with another table's lock (so there is no lock order to get wrong).
* **Item data is copied outside the lock.** Inserts reserve slots (state WRITING),
  and for sequence items the step rows they reference (pinning rows that already hold
  a step, taking free rows for new ones), copy, then commit (state READY). Samples
  draw slots and record each slot's ``version`` and its rows' generations under the
  lock, copy, then re-check them (a seqlock): an item evicted and overwritten during
  the copy is drawn again, so no torn item escapes. An item the sample itself deletes
  (``max_times_sampled``) keeps its slot DRAINING until the sampler has copied it, so
  that case needs no redraw (which would lose a queue's item).
  One exception, for the actor's hot path: a single ``insert`` of an item under 8 KiB
  is copied under the lock, from a process-local staging block, inside the one call
  that reserves and publishes it (``kernels.insert_staged``). Tens of nanoseconds of
  copying cost less than a second lock round trip on a contended lock.
* **Dead holder.** The kernel releases a robust mutex when its holder dies, and the
  next locker gets ``EOWNERDEAD``. That locker rebuilds every derived structure from
  the slot states (which are written last, so they are always meaningful), marks the
  mutex consistent and goes on. Nobody waits for a dead process.
* **Dead writer.** A writer that dies between reserve and commit leaves WRITING slots
  stamped with its pid and pid namespace (a sampler, DRAINING slots). A refused
  inserter (and ``verify``) checks the pids of its own namespace and frees the slots of
  dead processes (``reclaim``, ``shmreplay._shm.procs``), with their row references, so
  their reservation never starves others. A commit checks its slots are still its own.
* **Stopped holder.** A holder that is stopped (SIGSTOP, Ctrl-Z, a debugger) keeps the
  lock. Lockers sleep in ``pthread_mutex_timedlock`` for at most ``LOCK_SLICE_NS``, then
  return ``LOCK_BUSY`` having changed nothing, and Python checks the caller's deadline,
  Ctrl-C and a stopped buffer before trying again (``shmreplay._shm.lock_waits``).
* **Waiting never spins.** A call that the rate limiter blocks registers as a waiter
  and sleeps on a futex word (``C_ITEMS_SEQ`` for samplers, ``C_SPACE_SEQ`` for
  inserters) with the sequence value it read under the lock, so a change made after it
  unlocked wakes it at once (no lost wake-up). Every change bumps the word under the
  lock and, if waiters are registered, wakes them after unlocking. Sleeps are cut into
  slices of ``WAIT_SLICE`` seconds, so a waiter re-checks even if a waker died between
  bump and wake.
* **Stop.** ``Server.stop`` sets ``C_CLOSED`` in every table (without the lock if a
  stopped process keeps it for a second), bumps and wakes both
  words, then unlinks the segments; blocked calls return ``BufferBrokenError``.

This module holds the native primitives (declared as numba external functions so the
kernels that call them can be cached on disk) and the Python-side mutex setup.
"""

import ctypes
import errno

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from shmreplay._shm.kernels import kernel

WAIT_SLICE = 0.05  # seconds; a waiter re-checks at least this often
# Critical sections last microseconds: retry the lock this many times (about 0.1-0.5 ms)
# before sleeping in the kernel, because a futex sleep and wake-up costs tens of
# microseconds. Measured with an actor and a learner on 2 cores: 1,000 spins gave the
# actor 46k inserts/s, 5,000 gave it 118k/s (the learner ran at ~3.9M items/s both ways).
LOCK_SPINS = 5000
# After spinning, a locker sleeps in the kernel at most this long before it returns to
# Python (``LOCK_BUSY``), which checks the caller's deadline, a stopped buffer and
# Ctrl-C, then tries again. So no call waits for a lock without limit while its holder
# is stopped (SIGSTOP, Ctrl-Z, a debugger, a frozen cgroup).
LOCK_SLICE_NS = 20_000_000
EBUSY = errno.EBUSY

EOWNERDEAD = errno.EOWNERDEAD
ENOTRECOVERABLE = errno.ENOTRECOVERABLE
ETIMEDOUT = errno.ETIMEDOUT
_SYS_FUTEX = 202  # x86_64
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1

# Resolved by symbol name at load time, so kernels using them can be cached.
mutex_lock = types.ExternalFunction("pthread_mutex_lock", types.int32(types.voidptr))
mutex_trylock = types.ExternalFunction("pthread_mutex_trylock", types.int32(types.voidptr))
mutex_unlock = types.ExternalFunction("pthread_mutex_unlock", types.int32(types.voidptr))
mutex_consistent = types.ExternalFunction("pthread_mutex_consistent", types.int32(types.voidptr))
_getpid = types.ExternalFunction("getpid", types.int32())
memcpy = types.ExternalFunction("memcpy", types.voidptr(types.voidptr, types.voidptr, types.intp))
_raise_signal = types.ExternalFunction("raise", types.int32(types.int32))
_SIGSTOP = 19  # x86_64 Linux

_syscall6 = types.ExternalFunction(
    "syscall", types.int64(types.int64, types.voidptr, types.int64, types.int64,
                           types.voidptr, types.voidptr, types.int64))


@intrinsic
def fence(typingctx):
    """A full memory barrier: no load or store moves across it (compiler or CPU).

    Kernels that copy item data and then re-check the seqlock in one native call need
    it, so that the re-check's loads are not done before the copy's.
    """
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


_CLOCK_REALTIME = 0  # pthread_mutex_timedlock's clock


@intrinsic
def timed_lock(typingctx, address, slice_ns):
    """``pthread_mutex_timedlock`` of the mutex at ``address`` for at most ``slice_ns``:
    0, EOWNERDEAD, ETIMEDOUT or another error number.

    An intrinsic, because the absolute deadline is a ``struct timespec`` that must live
    somewhere, and kernels do not allocate: this one lives on the native stack.
    """
    def codegen(context, builder, signature, args):
        mutex, slice_ns = args
        i8p = ir.IntType(8).as_pointer()
        i32, i64 = ir.IntType(32), ir.IntType(64)
        deadline = cgutils.alloca_once(builder, ir.ArrayType(i64, 2))
        deadline_p = builder.bitcast(deadline, i8p)
        clock = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, [i32, i8p]), "clock_gettime")
        builder.call(clock, [i32(_CLOCK_REALTIME), deadline_p])
        sec_p = builder.gep(deadline, [i32(0), i32(0)])
        nsec_p = builder.gep(deadline, [i32(0), i32(1)])
        total = builder.add(builder.load(nsec_p), slice_ns)
        billion = i64(1_000_000_000)
        builder.store(builder.add(builder.load(sec_p), builder.sdiv(total, billion)), sec_p)
        builder.store(builder.srem(total, billion), nsec_p)
        lock = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, [i8p, i8p]), "pthread_mutex_timedlock")
        if isinstance(mutex.type, ir.IntType):
            mutex = builder.inttoptr(mutex, i8p)
        return builder.call(lock, [builder.bitcast(mutex, i8p), deadline_p])
    if not isinstance(address, (types.Integer, types.RawPointer, types.CPointer)):
        return None
    return types.int32(address, types.int64), codegen


def bump_and_wake_from_python(word_array, indices):
    """Changes each futex word of ``word_array`` at ``indices`` and wakes all its
    waiters, from Python (``TableEngine.close`` in a process that has not loaded its
    kernels: loading them then could wait on numba's locks, held by a main thread that
    is compiling when SIGTERM's thread stops the Server). Not atomic: a concurrent
    change may be lost, which only matters to a waiter if it is the same value, and a
    waiter re-reads ``C_CLOSED`` when woken."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    for index in indices:
        word_array[index] += 1
        libc.syscall(ctypes.c_long(_SYS_FUTEX),
                     ctypes.c_void_p(word_array.ctypes.data + int(index) * 8),
                     ctypes.c_long(_FUTEX_WAKE), ctypes.c_long(0x7FFFFFFF),
                     ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))


@kernel
def futex_wake_all(word_array, index):
    """Wakes every process sleeping on ``word_array[index]`` (its low 32 bits)."""
    address = word_array.ctypes.data + index * 8
    return _syscall6(_SYS_FUTEX, address, _FUTEX_WAKE, 0x7FFFFFFF, 0, 0, 0)


@kernel
def futex_wait(word_array, index, expected, timeout_ns, timespec):
    """Sleeps while ``word_array[index]``'s low 32 bits equal ``expected``, at most ``timeout_ns``.

    ``timespec`` is an int64 scratch array of 2 (kernels do not allocate).
    """
    timespec[0] = timeout_ns // 1_000_000_000
    timespec[1] = timeout_ns % 1_000_000_000
    address = word_array.ctypes.data + index * 8
    return _syscall6(_SYS_FUTEX, address, _FUTEX_WAIT, expected & 0xFFFFFFFF,
                     timespec.ctypes.data, 0, 0)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("pthread_mutexattr_init", "pthread_mutexattr_destroy"):
        getattr(libc, name).argtypes = [ctypes.c_void_p]
    for name in ("pthread_mutexattr_setpshared", "pthread_mutexattr_setrobust"):
        getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_int]
    libc.pthread_mutex_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return libc


_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1


def init_robust_mutex(ctrl: np.ndarray):
    """Initializes the process-shared robust mutex in ``ctrl``'s first 64 bytes.

    Only the creator of a table calls this, before anyone else can see the table.
    """
    libc = _libc()
    attr = ctypes.create_string_buffer(64)
    for call, args in ((libc.pthread_mutexattr_init, ()),
                       (libc.pthread_mutexattr_setpshared, (_PTHREAD_PROCESS_SHARED,)),
                       (libc.pthread_mutexattr_setrobust, (_PTHREAD_MUTEX_ROBUST,)),
                       (libc.pthread_mutex_init, None)):
        if args is None:
            result = call(ctrl.ctypes.data, attr)
        else:
            result = call(attr, *args)
        if result != 0:
            raise OSError(result, f"{call.__name__} failed")
    libc.pthread_mutexattr_destroy(attr)


@kernel
def stop_self_if(armed_pid):
    """Stops this process (SIGSTOP) if it is ``armed_pid``: the tests' crash points."""
    pid = _getpid()
    if pid == armed_pid:
        _raise_signal(_SIGSTOP)
