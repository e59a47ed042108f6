"""Every nest kind takes the fast paths (issue 20): ``insert``, ``insert_batch``, the
legacy ``Writer`` and ``TrajectoryWriter`` read lists, namedtuples, nested dicts and
mixtures by their structure's flattening plan (``shmreplay._schema.nest_plans``), and
``TrajectoryWriter.create_item`` inserts items of squeezed references, of mixed windows
and squeezed references and n-step transitions without its general path.

"Fast path taken" is checked with counters on the general paths (``Client._insert``,
``specs.flatten``, ``PendingItems.add``), not with timing. Each test also checks what
the items hold, and that data the table does not take still gets the general path's
typed errors.
"""

import collections
import contextlib
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, specs
from shmreplay._writers import pending as _pending
from shmreplay._writers.history import TrajectoryColumn

import _names
from _nests import sample_nests

Transition = collections.namedtuple("Transition", "obs act rew next_obs done")
Inner = collections.namedtuple("Inner", "pos vel")


def _step(i):
    obs = np.arange(4, dtype=np.float32) + i
    return dict(obs=obs, act=np.full(2, i, np.int32), rew=np.float32(i / 2),
                next_obs=obs + 1, done=np.bool_(i % 3 == 0))


def _form(kind, d):
    """One step's five leaves as nest ``kind``, and the same leaves in the order the
    table's columns (and sampled items) list them."""
    if kind == "list":
        return [d["obs"], d["act"], d["rew"], d["next_obs"], d["done"]]
    if kind == "namedtuple":
        return Transition(**d)
    if kind == "nested_dict":
        return {"o": {"obs": d["obs"], "next_obs": d["next_obs"]}, "act": d["act"],
                "rew": d["rew"], "done": d["done"]}
    if kind == "tuple_of_dicts":
        return ({"obs": d["obs"], "act": d["act"]}, [d["rew"], d["done"]], d["next_obs"])
    if kind == "namedtuple_nested":
        return Transition(obs=Inner(d["obs"], d["next_obs"]), act=d["act"], rew=d["rew"],
                          next_obs={"x": d["next_obs"]}, done=d["done"])
    raise AssertionError(kind)


KINDS = ["list", "namedtuple", "nested_dict", "tuple_of_dicts", "namedtuple_nested"]


def _batched(kind, steps):
    leaves = [specs.flatten(_form(kind, s))[0] for s in steps]
    treedef = specs.flatten(_form(kind, steps[0]))[1]
    return specs.optree.tree_unflatten(treedef, [np.stack(c) for c in zip(*leaves)])


@contextlib.contextmanager
def serve(*tables):
    with shmreplay.Server(tables=list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield client
        finally:
            client.close()


def _queue(name="q", size=64, **kwargs):
    return shmreplay.Table.queue(name, size, **kwargs)


@pytest.fixture
def general_inserts(monkeypatch):
    """How many inserts took ``Client``'s general path."""
    calls = []
    original = shmreplay.Client._insert

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(shmreplay.Client, "_insert", counting)
    return calls


@pytest.fixture
def flattens(monkeypatch):
    """How many nests were flattened by optree through ``specs.flatten`` (the writers'
    general path)."""
    calls = []
    original = specs.flatten

    def counting(nest):
        calls.append(1)
        return original(nest)

    monkeypatch.setattr(specs, "flatten", counting)
    return calls


def _leaves(nest):
    return specs.optree.tree_leaves(nest)


def _assert_same(got, want, one_step=False):
    """``one_step``: ``got`` is an inserted item, sampled with Reverb's time dimension of
    one step (``Client.sample``)."""
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        a = np.asarray(a)
        if one_step:
            assert a.shape[0] == 1
            a = a[0]
        np.testing.assert_array_equal(a, np.asarray(b))
        assert a.dtype == np.asarray(b).dtype


# --- insert and insert_batch --------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_insert_takes_the_fast_path(kind, general_inserts):
    with serve(_queue()) as client:
        client.insert(_form(kind, _step(0)), {"q": 1.0})  # (the first item defines the table)
        before = len(general_inserts)
        for i in range(1, 6):
            client.insert(_form(kind, _step(i)), {"q": 1.0})
        assert len(general_inserts) == before  # none took the general path
        got = [s.data for s in sample_nests(client, "q", emit_timesteps=False, num_samples=6)]
        for i, item in enumerate(got):
            _assert_same(item, _form(kind, _step(i)), one_step=True)


@pytest.mark.parametrize("kind", ["list", "namedtuple", "nested_dict"])
def test_python_scalars_and_0d_arrays_as_leaves(kind, general_inserts):
    """Leaves may be Python scalars, 0-d arrays and numpy scalars, as on the flat path."""
    with serve(_queue()) as client:
        client.insert(_form(kind, _step(0)), {"q": 1.0})
        before = len(general_inserts)
        step = _step(1)
        step["rew"], step["done"] = 0.5, np.array(True)  # a Python float, a 0-d array
        client.insert(_form(kind, step), {"q": 1.0})
        assert len(general_inserts) == before
        _, got = [s.data for s in sample_nests(client, "q", emit_timesteps=False,
                                                num_samples=2)]
        step["rew"], step["done"] = np.float32(0.5), np.bool_(True)
        _assert_same(got, _form(kind, step), one_step=True)


@pytest.mark.parametrize("kind", KINDS)
def test_insert_batch_takes_the_fast_path(kind, general_inserts):
    with serve(_queue()) as client:
        client.insert(_form(kind, _step(0)), {"q": 1.0})
        before = len(general_inserts)
        client.insert_batch(_batched(kind, [_step(i) for i in range(1, 5)]), {"q": 1.0})
        assert len(general_inserts) == before
        got = [s.data for s in sample_nests(client, "q", emit_timesteps=False, num_samples=5)]
        for i, item in enumerate(got):
            _assert_same(item, _form(kind, _step(i)), one_step=True)


def test_signature_tables_take_positional_nests_fast(general_inserts):
    """A table with a (dict) signature takes a list or tuple by its flattened leaves, as
    Reverb does (docs/migrating-from-reverb.md): on the fast path too."""
    sig = {k: shmreplay.TensorSpec(np.shape(v), np.asarray(v).dtype) for k, v in _step(0).items()}
    with serve(_queue(signature=sig)) as client:
        flat = [_step(0)[k] for k in sorted(sig)]  # the signature's leaves, in its order
        client.insert(_step(0), {"q": 1.0})  # (the first item maps the table's columns)
        before = len(general_inserts)
        client.insert(flat, {"q": 1.0})
        client.insert(tuple(flat), {"q": 1.0})
        assert len(general_inserts) == before
        for sample in client.sample("q", emit_timesteps=False, num_samples=3):
            _assert_same(list(sample.data), flat, one_step=True)


def test_a_namedtuple_class_of_the_same_name_and_fields_is_the_same_structure(general_inserts):
    """A script's ``__main__`` namedtuple is another class in each process: the fast path
    matches it by name and fields, as the general path does."""
    with serve(_queue()) as client:
        client.insert(Transition(**_step(0)), {"q": 1.0})
        Again = collections.namedtuple("Transition", "obs act rew next_obs done")
        assert Again is not Transition
        client.insert(Again(**_step(1)), {"q": 1.0})
        assert not general_inserts[1:]


_SCRIPT = """
import collections, sys
import numpy as np
import shmreplay

Transition = collections.namedtuple("Transition", "obs act rew next_obs done")  # __main__'s
general = []
original = shmreplay.Client._insert
shmreplay.Client._insert = lambda self, *a, **k: general.append(1) or original(self, *a, **k)
with shmreplay.Client(sys.argv[1]) as client:
    for i in range(5):
        client.insert(Transition(np.full(4, i, np.float32), np.full(2, i, np.int32),
                                 np.float32(i), np.zeros(4, np.float32), np.bool_(False)),
                      {"q": 1.0})
print(len(general))
"""


def test_a_spawned_scripts_namedtuple_takes_the_fast_path(tmp_path):
    """A script's ``__main__`` namedtuple, inserted into a table this process's class
    defined, takes the fast path (matched by name and fields)."""
    script = tmp_path / "actor.py"
    script.write_text(_SCRIPT)
    # The learner's script defines it in its own ``__main__`` too (the table's copy of it
    # then travels by value).
    Learners = collections.namedtuple("Transition", Transition._fields, module="__main__")
    with shmreplay.Server(tables=[_queue()], name=_names.unique()) as server:
        with shmreplay.Client(server.name) as client:
            client.insert(Learners(**_step(0)), {"q": 1.0})
            root = os.path.dirname(os.path.dirname(os.path.abspath(shmreplay.__file__)))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                filter(None, [root, os.environ.get("PYTHONPATH")])))
            out = subprocess.run([sys.executable, str(script), server.name],
                                 capture_output=True, text=True, timeout=120, env=env)
            assert out.returncode == 0, out.stderr
            assert out.stdout.split()[-1] == "0"  # no insert took the general path
            assert client.server_info()["q"].current_size == 6


@pytest.mark.parametrize("kind", ["list", "namedtuple", "nested_dict"])
def test_mismatches_still_get_the_general_paths_errors(kind, general_inserts):
    with serve(_queue(arena_bytes=0)) as client:  # (no general store to take them)
        client.insert(_form(kind, _step(0)), {"q": 1.0})
        for i in range(3):  # (plans made and used before the mismatches)
            client.insert(_form(kind, _step(i)), {"q": 1.0})
        assert len(general_inserts) == 1
        bad = _step(1)
        bad["obs"] = bad["obs"].astype(np.float64)
        with pytest.raises(errors.SchemaError, match="obs|\\[0\\]"):
            client.insert(_form(kind, bad), {"q": 1.0})
        short = _step(1)
        short["act"] = short["act"][:1]
        with pytest.raises(errors.SchemaError, match="shape"):
            client.insert(_form(kind, short), {"q": 1.0})
        other = {"list": tuple, "namedtuple": list, "nested_dict": lambda n: dict(n, extra=1)}
        with pytest.raises(errors.SchemaError, match="structure"):
            client.insert(other[kind](_form(kind, _step(1))), {"q": 1.0})
        missing = _form(kind, _step(1))
        if kind == "nested_dict":
            missing["o"]["obs"] = None
        elif kind == "list":
            missing[0] = None
        else:
            missing = missing._replace(obs=None)
        with pytest.raises(errors.MissingValueError):
            client.insert(missing, {"q": 1.0})
        assert client.server_info()["q"].current_size == 4


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_nests_are_built_without_optree(kind):
    """A table of any nest structure rebuilds sampled nests with generated code
    (``nest_plans.builder_for``), which builds what optree would: types, dict key order."""
    with serve(_queue()) as client:
        client.insert(_form(kind, _step(0)), {"q": 1.0})
        engine = client._engine("q")
        assert not isinstance(engine._unflatten, functools.partial)  # (optree's)
        got = client.sample_batch("q", 1).data
        leaves, treedef = specs.flatten(_form(kind, _step(0)))
        want = specs.optree.tree_unflatten(treedef, [np.asarray(x)[None] for x in leaves])
        assert specs.optree.tree_structure(got) == treedef
        assert repr(specs.optree.tree_map(lambda x: 0, got)) == repr(
            specs.optree.tree_map(lambda x: 0, want))  # (dict keys in the same order)
        _assert_same(got, want)


# --- the legacy Writer ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_writer_append_takes_the_fast_path(kind, flattens):
    with serve(_queue()) as client:
        with client.writer(2) as writer:
            writer.append(_form(kind, _step(0)))
            for i in range(1, 4):
                before = len(flattens)
                writer.append(_form(kind, _step(i)))
                assert len(flattens) == before
                writer.create_item("q", 2, 1.0)
        got = [s.data for s in sample_nests(client, "q", emit_timesteps=False, num_samples=3)]
        for i, item in enumerate(got):
            want = [_step(i), _step(i + 1)]
            _assert_same(item, _batched(kind, want))


# --- TrajectoryWriter ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_trajectory_writer_append_takes_the_fast_path(kind, flattens):
    with serve(_queue()) as client:
        writer = client.trajectory_writer(2)
        writer.append(_form(kind, _step(0)))
        writer.append(_form(kind, _step(1)))
        before = len(flattens)
        for i in range(2, 5):
            writer.append(_form(kind, _step(i)))
        assert len(flattens) == before
        history = writer.history
        item = specs.optree.tree_map(lambda column: column[-2:], history)
        writer.create_item("q", 1.0, item)
        writer.flush()
        sample, = sample_nests(client, "q", emit_timesteps=False, num_samples=1)
        _assert_same(sample.data, _batched(kind, [_step(3), _step(4)]))
        writer.close()


@pytest.fixture
def pending_adds(monkeypatch):
    """How many items took ``create_item``'s general path to the end (``PendingItems.add``)."""
    calls = []
    original = _pending.PendingItems.add

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_pending.PendingItems, "add", counting)
    return calls


def _items(kind, n):
    """``history -> trajectory`` for item ``kind``, and the item it makes after step ``t``
    (steps are ``_step(i)`` appended as flat dicts)."""
    if kind == "squeezed":
        make = lambda h: {k: h[k][-1] for k in ("obs", "act", "rew", "next_obs", "done")}
        want = lambda t: _step(t)
    elif kind == "squeezed_namedtuple":
        make = lambda h: Transition(h["obs"][-1], h["act"][-1], h["rew"][-1],
                                    h["next_obs"][-1], h["done"][-1])
        want = lambda t: Transition(**_step(t))
    elif kind == "mixed":
        make = lambda h: {"obs": h["obs"][-2:], "act": h["act"][-1], "rew": h["rew"][-2:]}
        want = lambda t: {"obs": np.stack([_step(t - 1)["obs"], _step(t)["obs"]]),
                          "act": _step(t)["act"],
                          "rew": np.stack([_step(t - 1)["rew"], _step(t)["rew"]])}
    elif kind == "n_step":  # obs at [-n-1], rewards [-n:], next obs at [-1]
        make = lambda h: {"obs": h["obs"][-n - 1], "act": h["act"][-n - 1],
                          "rew": h["rew"][-n:], "next_obs": h["obs"][-1]}
        want = lambda t: {"obs": _step(t - n)["obs"], "act": _step(t - n)["act"],
                          "rew": np.stack([_step(i)["rew"] for i in range(t - n + 1, t + 1)]),
                          "next_obs": _step(t)["obs"]}
    else:
        raise AssertionError(kind)
    return make, want


@pytest.fixture
def checked_columns(monkeypatch):
    """How many ``TrajectoryColumn``s were made by their checking constructor (``history``
    makes recent windows and steps without it)."""
    calls = []
    original = TrajectoryColumn.__init__

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TrajectoryColumn, "__init__", counting)
    return calls


@pytest.mark.parametrize("kind", ["squeezed", "squeezed_namedtuple", "mixed", "n_step"])
def test_trajectory_writer_items_take_the_fast_path(kind, flattens, pending_adds,
                                                   checked_columns):
    n = 3
    make, want = _items(kind, n)
    with serve(_queue(size=100)) as client:
        writer = client.trajectory_writer(n + 1)
        made = []
        for t in range(12):
            writer.append(_step(t))
            if t >= n:
                if t == n + 2:
                    flattened, general = len(flattens), len(pending_adds)
                writer.create_item("q", 1.0, make(writer.history))
                made.append(t)
        # After the first items, every later one skipped the general path.
        assert len(flattens) == flattened and len(pending_adds) == general
        assert not checked_columns
        writer.close()
        got = [s.data for s in sample_nests(client, "q", emit_timesteps=False, num_samples=len(made))]
        for t, item in zip(made, got):
            _assert_same(item, want(t))


def test_n_step_items_share_their_steps_and_survive_eviction(pending_adds):
    """n-step items over a small table, on the fast path: the rows a step went to are
    reused by later items, and a step whose row was freed is written again (each item
    still reads the right values)."""
    n = 2
    make, want = _items("n_step", n)
    table = shmreplay.Table("q", sampler=shmreplay.selectors.Uniform(),
                            remover=shmreplay.selectors.Fifo(), max_size=4,
                            rate_limiter=shmreplay.rate_limiters.MinSize(1))
    with serve(table) as client:
        writer = client.trajectory_writer(n + 1)
        for t in range(40):
            writer.append(_step(t))
            if writer.episode_steps > n:
                writer.create_item("q", 1.0, make(writer.history))
                if t % 5 == 0:  # (older items are evicted: their rows are reused)
                    for sample in sample_nests(client, "q", emit_timesteps=False, num_samples=2):
                        t0 = int(sample.data["next_obs"][0])
                        _assert_same(sample.data, want(t0))
            if t == 20:
                writer.end_episode()
        writer.close()
        assert len(pending_adds) <= 4  # (the first items of each episode only)


def test_items_over_an_episode_boundary_are_still_refused(pending_adds):
    with serve(_queue()) as client:
        writer = client.trajectory_writer(3)
        for t in range(6):
            writer.append(_step(t))
            if t >= 1:
                writer.create_item("q", 1.0, {"obs": writer.history["obs"][-2],
                                              "next": writer.history["obs"][-1]})
        assert len(pending_adds) <= 2  # the later ones took the fast path
        obs = writer.history["obs"][-1]
        writer.end_episode(clear_buffers=False)
        writer.append(_step(9))
        with pytest.raises(ValueError, match="episode"):
            writer.create_item("q", 1.0, {"obs": obs, "next": writer.history["obs"][-1]})
        writer.close()
