"""Numba kernels. Arrays and scalars in, status codes out; no Python objects, no config.

``sumtree`` and ``heap`` are pure array algorithms. ``table`` names the entry points
that take a table's lock (see ``shmreplay._shm.sync`` for the protocol) and run one whole
operation natively; they are defined by job in ``locking``, ``views``, ``inserting``,
``sampling``, ``priorities`` and ``upkeep``. Import these modules only where they are
used: importing ``shmreplay`` compiles nothing, and importing this package (or
``codes``) does not load numba. How kernels are compiled, cached and shared between
processes is ``_jit``'s job.
"""


def kernel(function):
    """Compiles ``function`` the way every kernel is compiled.

    ``_nrt=False`` turns off numba's reference counting: kernels never allocate (callers
    pass scratch arrays), and without it every call between kernels costs two atomic
    operations per array argument, which made per-item bookkeeping about 10x slower.
    ``cache=True`` keeps compiled code on disk, so new processes do not recompile.
    ``error_model="numpy"``: arithmetic never raises (x / 0 gives inf), because an
    exception inside a locked kernel would leave the table's mutex held by a live
    process. (Out-of-bounds indexing is checked only in CI's NUMBA_BOUNDSCHECK leg.)
    """
    from shmreplay._shm.kernels import _jit
    return _jit.jit(function, inline=False)


def inlined_kernel(function):
    """``kernel``, inlined by numba into every kernel that calls it.

    For per-item steps called in loops (adding, unlinking, freeing an item): LLVM does
    not inline them by itself, and a call passing the table's arrays costs about 10 ns,
    more than the step's own work.
    """
    from shmreplay._shm.kernels import _jit
    return _jit.jit(function, inline=True)
