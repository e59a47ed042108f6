"""Shared fixtures: every test must leave /dev/shm exactly as it found it."""

import os

import pytest

import _names

SHM_DIR = "/dev/shm"
# This run's objects: buffers named by ``_names.unique`` and port buffers
# (``port-P``) whose owner is this process. Other runs on the machine are not ours.
_TEST_PREFIXES = (f"shmreplay.test-{_names.RUN}-", f"sem.shmreplay.test-{_names.RUN}-")


def _shmreplay_objects():
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return set()
    return ({n for n in names if n.startswith(_TEST_PREFIXES)}
            | _names.port_buffers_of({os.getpid()}, names))


@pytest.fixture(autouse=True)
def no_shared_memory_leaks():
    """Fails the test if it leaves a shmreplay segment or semaphore behind."""
    before = _shmreplay_objects()
    yield
    leaked = _shmreplay_objects() - before
    if leaked:
        for name in leaked:  # clean up so one leak does not fail every later test
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
        pytest.fail(f"test leaked shared-memory objects: {sorted(leaked)}")


@pytest.fixture
def buffer_name(request):
    """A unique buffer name for this test (``test-<run>-...``)."""
    return _names.unique()


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """Compiles every kernel once, in this process, before any test spawns workers.

    numba caches compiled kernels on disk; without this, the first tests' spawned
    processes would all compile the same kernels at the same time.
    """
    import _mp_workers
    _mp_workers.warm_kernels()


# JAX and TensorFlow start threads once used; a process with such threads must not
# fork (the fork tests of test_lifecycle do), so the tests that use them run last.
_LAST = ("test_jax.py", "test_reverb_clients.py", "test_tf_datasets.py",
         "test_pattern_dataset.py", "test_tf_any_length.py", "test_jax_any_length.py")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name in _LAST)  # stable: order kept otherwise
