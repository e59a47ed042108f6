"""Items a writer created that their table's rate limiter has not admitted yet.

``create_item`` never blocks (as in Reverb): an item the table refuses waits here, in
creation order per table, and goes in at a later call or at ``flush``. Both writers
keep one ``PendingItems``.
"""

import collections
import time
from typing import Optional

from shmreplay import errors
from shmreplay._writers.writing import ItemPlan, TableRows, insert_item

_PENDING_SLICE = 0.05  # seconds a flush waits on one table before retrying the others


class PendingItems:
    """Items created but not yet admitted by their table's rate limiter.

    Items of one table go in in creation order; a table that refuses does not hold back
    the items of other tables (as Reverb's server queues blocked inserts per table).
    """

    def __init__(self):
        self.items = collections.deque()  # (rows, plan, columns, priority, uids)

    def __len__(self):
        return len(self.items)

    def add(self, rows: TableRows, plan: ItemPlan, columns, priority: float, uids=None):
        """Inserts the item now if no earlier item of its table waits and it can go in
        without waiting; otherwise keeps it for later. ``uids``: as in ``insert_item``."""
        engine = rows.engine
        if not any(item[0].engine is engine for item in self.items):
            try:
                insert_item(rows, plan, columns, priority, 0.0, uids)
                return
            except errors.DeadlineExceededError:
                pass
        self.items.append((rows, plan, columns, priority, uids))
        self.drain(0.0)

    def drain(self, timeout: Optional[float], leave: int = 0):
        """Inserts waiting items until at most ``leave`` remain.

        ``timeout`` bounds the whole call (None: wait as long as needed, 0: only what
        goes in at once). Returns True when done; False if the time ran out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.items) > leave:
            self._insert_admitted()
            if len(self.items) <= leave:
                break
            # Wait for the oldest item's table, a slice at a time: the other tables'
            # items are retried between slices, so a table that stays full holds back
            # only its own.
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if remaining == 0.0:
                return False
            rows, plan, columns, priority, uids = self.items[0]
            wait = _PENDING_SLICE if remaining is None else min(remaining, _PENDING_SLICE)
            try:
                insert_item(rows, plan, columns, priority, wait, uids)
            except errors.DeadlineExceededError:
                continue
            self.items.popleft()
        return True

    def _insert_admitted(self):
        """One pass without waiting: each table's items in order, until one is refused."""
        refused = set()
        inserted = set()
        try:
            for item in self.items:
                rows, plan, columns, priority, uids = item
                if id(rows.engine) in refused:
                    continue
                try:
                    insert_item(rows, plan, columns, priority, 0.0, uids)
                except errors.DeadlineExceededError:
                    refused.add(id(rows.engine))
                    continue
                inserted.add(id(item))
        finally:  # even if an insert failed otherwise, forget the items that went in
            if inserted:
                self.items = collections.deque(
                    item for item in self.items if id(item) not in inserted)
