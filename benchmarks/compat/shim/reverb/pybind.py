"""Reverb's C++ bindings. Names with a public shmreplay equivalent map onto it (Reverb's
tests use ``pybind.HeapSelector`` to recognise a heap selector); every other name is a
Reverb C++ internal and raises."""

from shmreplay import selectors as _selectors

FifoSelector = _selectors.Fifo
LifoSelector = _selectors.Lifo
PrioritizedSelector = _selectors.Prioritized
UniformSelector = _selectors.Uniform
HeapSelector = (_selectors.MinHeap, _selectors.MaxHeap)  # for isinstance


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"reverb.pybind.{name} is a Reverb C++ internal (no "
                              "equivalent in shmreplay)")
