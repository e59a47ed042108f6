"""A call run in a background thread, for tests that check whether it blocks."""

import threading


class Background:
    """Runs ``fn()`` in a daemon thread; ``still_blocked`` / ``finish`` observe it."""

    def __init__(self, fn):
        self.result = None
        self.error = None

        def run():
            try:
                self.result = fn()
            except BaseException as e:  # reported by finish()
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def still_blocked(self, wait=0.1):
        self.thread.join(wait)
        if self.error is not None:
            raise self.error
        return self.thread.is_alive()

    def finish(self, wait=5.0):
        self.thread.join(wait)
        assert not self.thread.is_alive(), "the call did not return in time"
        if self.error is not None:
            raise self.error
        return self.result
