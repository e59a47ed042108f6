"""Binary heaps of slots, for the MinHeap and MaxHeap selectors.

A heap is one row of the table's ``meta`` array (slots by heap position); the slot's
position in the heap is kept in another row, so removing or re-prioritizing any item is
O(log n). Order: priority (ascending for a min-heap, descending for a max-heap), then the
item's update sequence number, so ties go to the least recently inserted or updated item
(Reverb's rule).
"""

from shmreplay._shm.kernels import kernel
from shmreplay._shm.layout import M_UPDATE


@kernel
def before(meta, prio, a, b, is_min):
    pa = prio[a]
    pb = prio[b]
    if pa != pb:
        return pa < pb if is_min else pa > pb
    return meta[a, M_UPDATE] < meta[b, M_UPDATE]


@kernel
def _sift_up(meta, prio, heap_row, pos_row, pos, is_min):
    heap = meta[:, heap_row]
    slot = heap[pos]
    while pos > 0:
        parent = (pos - 1) // 2
        other = heap[parent]
        if not before(meta, prio, slot, other, is_min):
            break
        heap[pos] = other
        meta[other, pos_row] = pos
        pos = parent
    heap[pos] = slot
    meta[slot, pos_row] = pos
    return pos


@kernel
def _sift_down(meta, prio, heap_row, pos_row, pos, n, is_min):
    heap = meta[:, heap_row]
    slot = heap[pos]
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and before(meta, prio, heap[child + 1], heap[child], is_min):
            child += 1
        if not before(meta, prio, heap[child], slot, is_min):
            break
        heap[pos] = heap[child]
        meta[heap[child], pos_row] = pos
        pos = child
    heap[pos] = slot
    meta[slot, pos_row] = pos


@kernel
def push(meta, prio, heap_row, pos_row, n, slot, is_min):
    """Adds ``slot`` to a heap of ``n`` entries (the caller stores ``n + 1``)."""
    meta[n, heap_row] = slot
    meta[slot, pos_row] = n
    _sift_up(meta, prio, heap_row, pos_row, n, is_min)


@kernel
def remove(meta, prio, heap_row, pos_row, n, slot, is_min):
    """Removes ``slot`` from a heap of ``n`` entries (the caller stores ``n - 1``)."""
    pos = meta[slot, pos_row]
    last = meta[n - 1, heap_row]
    if pos == n - 1:
        return
    meta[pos, heap_row] = last
    meta[last, pos_row] = pos
    fix(meta, prio, heap_row, pos_row, n - 1, last, is_min)


@kernel
def fix(meta, prio, heap_row, pos_row, n, slot, is_min):
    """Restores heap order after ``slot``'s priority or update number changed."""
    pos = _sift_up(meta, prio, heap_row, pos_row, meta[slot, pos_row], is_min)
    _sift_down(meta, prio, heap_row, pos_row, pos, n, is_min)
