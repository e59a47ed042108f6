"""Steps made of several ``append`` calls (``partial_step=True``, as Acme's adders make
every step) take ``TrajectoryWriter``'s short path (``shmreplay._writers.open_steps``),
with exactly the general path's semantics; ``history`` read by position (``[t]``,
``[a:b]``, Acme's n-step adder) gives windows, whose items skip ``create_item``'s
general path too (issue 20).

"Short path taken" is checked with counters (``StepParts.taken``, ``specs.flatten``,
``PendingItems.add``), not timing. Semantics are checked against the general path
itself: the same script of appends, ends of episodes and items run by a writer whose
short path is switched off must leave the same history and the same items.
"""

import collections
import contextlib

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, specs
from shmreplay._writers import open_steps as _open_steps
from shmreplay._writers import pending as _pending

import _names
from _nests import sample_nests

Transition = collections.namedtuple("Transition", "obs act rew disc next_obs extras")


@contextlib.contextmanager
def serve(*tables):
    with shmreplay.Server(tables=list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield client
        finally:
            client.close()


def _queue(name="q", size=256):
    return shmreplay.Table.queue(name, size)


@pytest.fixture
def flattens(monkeypatch):
    calls = []
    original = specs.flatten

    def counting(nest):
        calls.append(1)
        return original(nest)

    monkeypatch.setattr(specs, "flatten", counting)
    return calls


@pytest.fixture
def pending_adds(monkeypatch):
    calls = []
    original = _pending.PendingItems.add

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_pending.PendingItems, "add", counting)
    return calls


def _obs(t):
    return np.arange(3, dtype=np.float32) + t


# Two or three parts per step, as Acme's adders append them.
SPLITS = {
    "two": lambda t: [({"obs": _obs(t), "first": t == 0}, True),
                      ({"act": np.int64(t), "rew": np.float32(t / 2)}, False)],
    "three": lambda t: [({"obs": _obs(t), "first": t == 0}, True),
                        ({"ret": np.float32(-t)}, True),
                        ({"act": np.int64(t), "rew": np.float32(t / 2)}, False)],
    "nested": lambda t: [({"o": {"obs": _obs(t)}, "first": t == 0}, True),
                         ({"act": (np.int64(t), [np.float32(t / 2)])}, False)],
}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_partial_steps_take_the_short_path(split, flattens):
    with serve(_queue()) as client:
        writer = client.trajectory_writer(3)
        for t in range(3):  # (the first steps learn the parts' structures)
            for data, partial in SPLITS[split](t):
                writer.append(data, partial_step=partial)
        taken, flattened = writer._parts.taken, len(flattens)
        for t in range(3, 10):
            for data, partial in SPLITS[split](t):
                writer.append(data, partial_step=partial)
        assert writer._parts.taken - taken == 7 * len(SPLITS[split](0))
        assert len(flattens) == flattened
        obs = writer.history["o"]["obs"] if split == "nested" else writer.history["obs"]
        np.testing.assert_array_equal(obs[-3:].numpy(), np.stack([_obs(t) for t in (7, 8, 9)]))
        assert writer.episode_steps == 10
        writer.close()


def test_a_whole_step_after_parts_takes_the_whole_step_path():
    """A whole step of every field, first seen after partial steps, makes the next
    whole steps take the whole-step path (``_WholeSteps``)."""
    with serve(_queue()) as client:
        writer = client.trajectory_writer(2)
        writer.append({"x": np.int64(0)}, partial_step=True)
        writer.append({"y": np.int64(0)})
        for t in range(1, 4):
            writer.append({"x": np.int64(t), "y": np.int64(-t)})
        assert writer._whole_steps is not None
        np.testing.assert_array_equal(writer.history["y"][-2:].numpy(), [-2, -3])
        writer.close()


def test_a_field_set_twice_in_the_open_step_is_still_refused():
    with serve(_queue()) as client:
        writer = client.trajectory_writer(2)
        for t in range(3):
            writer.append({"x": np.int64(t)}, partial_step=True)
            writer.append({"y": np.int64(t)})
        writer.append({"x": np.int64(5)}, partial_step=True)
        taken = writer._parts.taken
        with pytest.raises(ValueError, match="already been set"):
            writer.append({"x": np.int64(6)}, partial_step=True)
        assert writer._parts.taken == taken
        writer.append({"y": np.int64(7)})  # the open step is unharmed
        assert writer.history["x"][-1].numpy() == 5 and writer.history["y"][-1].numpy() == 7
        writer.close()


def test_a_part_of_another_dtype_or_shape_gets_the_general_paths_error():
    with serve(_queue()) as client:
        writer = client.trajectory_writer(2)
        for t in range(3):
            writer.append({"x": _obs(t)}, partial_step=True)
            writer.append({"y": np.int64(t)})
        with pytest.raises(errors.SchemaError, match="dtype"):
            writer.append({"x": np.zeros(3, np.float64)}, partial_step=True)
        with pytest.raises(errors.SchemaError, match="shape"):
            writer.append({"x": np.zeros(4, np.float32)}, partial_step=True)
        writer.close()


def test_items_over_the_open_steps_fields():
    """An item may reference the open step's fields (Acme's n-step adder: the next
    observation and the n-step return are in the step still open)."""
    with serve(_queue()) as client:
        writer = client.trajectory_writer(3)
        for t in range(6):
            writer.append({"obs": _obs(t)}, partial_step=True)
            if t >= 1:
                history = writer.history
                writer.create_item("q", 1.0, {"obs": history["obs"][-2],
                                              "act": history["act"][-2],
                                              "next_obs": history["obs"][-1]})
            writer.append({"act": np.int64(t)})
        writer.flush()
        got = [s.data for s in sample_nests(client, "q", emit_timesteps=False, num_samples=5)]
        for t, item in zip(range(1, 6), got):
            np.testing.assert_array_equal(item["obs"], _obs(t - 1))
            assert item["act"] == t - 1
            np.testing.assert_array_equal(item["next_obs"], _obs(t))
        writer.close()


def test_history_of_the_open_step_reads_none_for_fields_not_set_yet():
    with serve(_queue()) as client:
        writer = client.trajectory_writer(3)
        for t in range(3):
            writer.append({"obs": _obs(t)}, partial_step=True)
            writer.append({"act": np.int64(t)})
        writer.append({"obs": _obs(3)}, partial_step=True)
        with pytest.raises(ValueError, match="None"):
            writer.history["act"][-1]
        with pytest.raises(ValueError, match="None"):
            writer.history["act"][3]
        np.testing.assert_array_equal(writer.history["obs"][3].numpy(), _obs(3))
        assert writer.episode_steps == 3 and writer.step_is_open
        writer.close()


def test_history_by_position_gives_windows_read_like_recent_ones():
    with serve(_queue()) as client:
        writer = client.trajectory_writer(4)
        for t in range(6):
            writer.append({"obs": _obs(t), "rew": np.float32(t)})
        history = writer.history
        assert history["obs"][3]._window and history["rew"][2:5]._window
        np.testing.assert_array_equal(history["obs"][3].numpy(), history["obs"][-3].numpy())
        rewards = history["rew"][2:5].numpy()
        assert rewards.dtype == np.float32 and rewards.tolist() == [2, 3, 4]
        assert history["obs"][2:6].numpy().shape == (4, 3)
        with pytest.raises(IndexError, match="index 6 out of range for 6 steps"):
            history["obs"][6]
        with pytest.raises(ValueError, match="None"):  # no longer kept
            history["obs"][1]
        with pytest.raises(ValueError, match="None"):
            history["obs"][0:3]
        writer.close()


def test_windows_of_strings_are_stacked_as_objects():
    with serve(_queue()) as client:
        writer = client.trajectory_writer(3)
        for word in ("a", "bb", "ccc"):
            writer.append({"w": word})
        got = writer.history["w"][-3:].numpy()
        assert got.tolist() == [b"a", b"bb", b"ccc"] or got.tolist() == ["a", "bb", "ccc"]
        writer.close()


def test_n_step_items_of_every_length_skip_the_general_path(pending_adds):
    """Acme's n-step transitions: ``[first]`` and ``[last]`` by position, n from 1 to
    N at an episode's start; each length is learnt, then takes the short path."""
    n = 3
    with serve(_queue(size=512)) as client:
        writer = client.trajectory_writer(n + 1)
        made = []
        for episode in range(3):
            if episode == 2:
                general = len(pending_adds)
            for t in range(12):
                writer.append({"obs": _obs(t)}, partial_step=True)
                if t >= 1:
                    first, last = max(0, t - n), t
                    history = writer.history
                    rew = history["rew"][first:last].numpy()
                    writer.append({"ret": np.float32(rew.sum())}, partial_step=True)
                    history = writer.history
                    writer.create_item("q", 1.0, Transition(
                        history["obs"][first], history["act"][first], history["ret"][-1],
                        history["rew"][first], history["obs"][last], ()))
                    made.append((first, last))
                writer.append({"act": np.int64(t), "rew": np.float32(t)})
            writer.end_episode()
        assert len(pending_adds) == general  # the third episode's items: all short
        got = [s.data for s in sample_nests(client, "q", emit_timesteps=False,
                                            num_samples=len(made))]
        for (first, last), item in zip(made, got):
            np.testing.assert_array_equal(item.obs, _obs(first))
            np.testing.assert_array_equal(item.next_obs, _obs(last))
            assert item.act == first and item.rew == np.float32(sum(range(first, last)))
        writer.close()


# --- the same semantics as the general path ------------------------------------------------

def _script(writer, rng):
    """A random script of parts (new fields on the way, None fields, both kinds of
    episode end with a step open, items over the open step); returns what it saw."""
    seen = []
    fields = ["a", "b", "c"]
    for op in range(160):
        if op == 60:
            fields.append("d")  # a field appears mid-episode
        r = rng.random()
        if r < 0.05:
            writer.end_episode(clear_buffers=bool(rng.random() < 0.5))
            seen.append(("end", writer.episode_steps))
            continue
        chosen = [f for f in fields if rng.random() < 0.5] or [fields[0]]
        data = {f: np.full(2, op, np.float32) if f == "a" else np.int64(op) for f in chosen}
        if rng.random() < 0.1:
            data[chosen[0]] = None  # a None field is no value
        try:
            writer.append(data, partial_step=bool(rng.random() < 0.6))
            seen.append(("ok", writer.episode_steps, writer.step_is_open))
        except ValueError as error:
            seen.append(("error", str(error)))
        if rng.random() < 0.3:
            try:
                writer.create_item("q", 1.0, {f: writer.history[f][-1] for f in chosen})
                seen.append("item")
            except (ValueError, KeyError) as error:
                seen.append(("item error", type(error).__name__))
    return seen


def _snapshot(writer):
    history = writer.history
    out = {}
    for path, column in sorted(writer._columns.items()):
        out[path] = [None if ref is None else (ref.uid, ref.expired, ref.value.tolist())
                     for ref in column.refs]
        out[path, "start"] = column.start
    out["steps"] = writer._history_steps
    out["fields"] = sorted(history)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_short_path_leaves_what_the_general_path_leaves(seed, monkeypatch):
    results = []
    for short in (True, False):
        if not short:
            monkeypatch.setattr(_open_steps.StepParts, "find", lambda self, data: None)
            monkeypatch.setattr(_open_steps.StepParts, "learn", lambda *args: None)
        with serve(_queue(size=1024)) as client:
            writer = client.trajectory_writer(3)
            seen = _script(writer, np.random.default_rng(seed))
            snapshot = _snapshot(writer)
            taken = writer._parts.taken
            writer.flush()
            items = [s.data for s in sample_nests(client, "q", emit_timesteps=False,
                                                  num_samples=client.server_info()["q"]
                                                  .current_size)]
            writer.close()
        results.append((seen, snapshot, [{k: np.asarray(v).tolist() for k, v in i.items()}
                                         for i in items], taken))
    (seen, snapshot, items, taken), (seen0, snapshot0, items0, taken0) = results
    assert taken > 10 and taken0 == 0
    assert seen == seen0
    assert snapshot == snapshot0
    assert items == items0
