"""Binary heaps of slots, for the MinHeap and MaxHeap selectors.

A heap is one row of the table's ``meta`` array (slots by heap position); the slot's
position in the heap is kept in another row, so removing or re-prioritizing any item is
O(log n). Order: priority (ascending for a min-heap, descending for a max-heap), then the
item's update sequence number, so ties go to the least recently inserted or updated item
(Reverb's rule).
"""

from shmreplay._kernels import kernel
from shmreplay._layout import M_UPDATE


@kernel
def before(meta, prio, a, b, is_min):
    pa = prio[a]
    pb = prio[b]
    if pa != pb:
        return pa < pb if is_min else pa > pb
    return meta[M_UPDATE, a] < meta[M_UPDATE, b]


@kernel
def _sift_up(meta, prio, heap_row, pos_row, pos, is_min):
    heap = meta[heap_row]
    slot = heap[pos]
    while pos > 0:
        parent = (pos - 1) // 2
        other = heap[parent]
        if not before(meta, prio, slot, other, is_min):
            break
        heap[pos] = other
        meta[pos_row, other] = pos
        pos = parent
    heap[pos] = slot
    meta[pos_row, slot] = pos
    return pos


@kernel
def _sift_down(meta, prio, heap_row, pos_row, pos, n, is_min):
    heap = meta[heap_row]
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
        meta[pos_row, heap[child]] = pos
        pos = child
    heap[pos] = slot
    meta[pos_row, slot] = pos


@kernel
def push(meta, prio, heap_row, pos_row, n, slot, is_min):
    """Adds ``slot`` to a heap of ``n`` entries (the caller stores ``n + 1``)."""
    meta[heap_row, n] = slot
    meta[pos_row, slot] = n
    _sift_up(meta, prio, heap_row, pos_row, n, is_min)


@kernel
def remove(meta, prio, heap_row, pos_row, n, slot, is_min):
    """Removes ``slot`` from a heap of ``n`` entries (the caller stores ``n - 1``)."""
    pos = meta[pos_row, slot]
    last = meta[heap_row, n - 1]
    if pos == n - 1:
        return
    meta[heap_row, pos] = last
    meta[pos_row, last] = pos
    fix(meta, prio, heap_row, pos_row, n - 1, last, is_min)


@kernel
def fix(meta, prio, heap_row, pos_row, n, slot, is_min):
    """Restores heap order after ``slot``'s priority or update number changed."""
    pos = _sift_up(meta, prio, heap_row, pos_row, meta[pos_row, slot], is_min)
    _sift_down(meta, prio, heap_row, pos_row, pos, n, is_min)
