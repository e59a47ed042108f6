"""Priority updates that do not make the learner wait for its TD errors.

A learner's TD errors come out of the step that was just dispatched (a JAX array still
being computed). Setting priorities from them at once would wait for that step, so
``BatchIterator.update_priorities(..., wait=False)`` hands them to one of these:

* ``ThreadedUpdates``: a thread fetches each update's errors once they exist and applies
  the updates in order (for iterators that sample in their own threads);
* ``InlineUpdates``: no thread; each call of the learner's (``next``, the next update,
  ``flush``) applies, in order, the queued updates whose errors are computed by then
  (for iterators that sample in the learner's thread: nothing else runs Python for it).

Both bound the queue (a learner that outruns its updates waits for the oldest), apply in
the order given, raise a failed update from the learner's next call and then drop the
updates queued after it. This module imports no JAX: an update's errors are anything
numpy can read; ``is_ready()`` (JAX arrays have it) says whether reading would wait.
"""

import collections
import queue
import threading

# Updates queued and not yet applied: a learner that outruns its updates waits for one
# of them (keeps the TD arrays held bounded).
MAX_PENDING_UPDATES = 8


class _Updates:
    """What both kinds share: the apply function, the error to raise, the count."""

    def __init__(self, apply):
        self._apply = apply   # (keys, td_errors, exponent, epsilon) -> keys found
        self._error = None
        self._updated = 0     # keys found by the queued updates since the last flush

    def raise_error(self):
        """Raises the error of a failed update, once."""
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc

    def _run(self, update):
        if self._error is None:  # after a failure, the rest are dropped
            try:
                self._updated += self._apply(*update)
            except BaseException as exc:  # raised to the learner by its next call
                self._error = exc

    def _take_count(self) -> int:
        updated, self._updated = self._updated, 0
        return updated


class ThreadedUpdates(_Updates):
    """Updates applied by their own thread (started on the first one)."""

    def __init__(self, apply, thread_name: str):
        super().__init__(apply)
        self._name = thread_name
        self._queue = None
        self._thread = None
        self._lock = threading.Lock()

    def add(self, update):
        self.raise_error()
        with self._lock:
            if self._thread is None:
                self._queue = queue.Queue(MAX_PENDING_UPDATES)
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name=self._name)
                self._thread.start()
        self._queue.put(update)

    def poll(self):
        """The learner's other calls: only a failure to report."""
        self.raise_error()

    def _serve(self):
        while True:
            update = self._queue.get()
            try:
                if update is None:
                    return
                self._run(update)
            finally:
                self._queue.task_done()

    def flush(self) -> int:
        if self._queue is not None:
            self._queue.join()
        self.raise_error()
        return self._take_count()

    def close(self):
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=5)


class InlineUpdates(_Updates):
    """Updates applied by the learner's own later calls, once their errors exist."""

    def __init__(self, apply):
        super().__init__(apply)
        self._pending = collections.deque()

    def add(self, update):
        self.poll()
        self._pending.append(update)
        while len(self._pending) > MAX_PENDING_UPDATES:  # waits for the oldest
            self._run(self._pending.popleft())
        self._report()

    def poll(self):
        """Applies the queued updates whose errors are computed (in order: stops at the
        first that is not), then raises a failure."""
        while self._pending and _ready(self._pending[0][1]):
            self._run(self._pending.popleft())
        self._report()

    def _report(self):
        if self._error is not None:
            self._pending.clear()  # the updates queued after a failed one are dropped
            self.raise_error()

    def flush(self) -> int:
        while self._pending:
            self._run(self._pending.popleft())
        self.raise_error()
        return self._take_count()

    def close(self):
        while self._pending and self._error is None:
            self._run(self._pending.popleft())
        self._pending.clear()


def _ready(td_errors) -> bool:
    is_ready = getattr(td_errors, "is_ready", None)
    return True if is_ready is None else bool(is_ready())
