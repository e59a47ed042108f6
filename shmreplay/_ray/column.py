"""``RemoteColumn``: what a remote writer's history gives, and its items are made of."""


class RemoteColumn:
    """An item's column: one field of the writer's history at some steps of the episode."""

    __slots__ = ("keys", "steps", "squeeze")

    def __init__(self, keys, steps, squeeze):
        self.keys = keys
        self.steps = steps
        self.squeeze = squeeze

    def __len__(self):
        return len(self.steps)

    def __getstate__(self):
        return self.keys, self.steps, self.squeeze

    def __setstate__(self, state):
        self.keys, self.steps, self.squeeze = state

    def __repr__(self):
        return f"RemoteColumn({self.keys}, steps={self.steps}, squeeze={self.squeeze})"
