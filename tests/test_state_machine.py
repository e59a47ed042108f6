"""Hypothesis state machines: one live table, driven through the public ``Client``,
against a plain-Python model.

``PrioritizedMachine``: sampler ``Prioritized(a)`` (a drawn from {0, 0.5, 1, 1.7}),
remover ``Fifo``, a small ``max_size`` so eviction happens, ``MinSize(1)``. Every
sampled row must carry exactly the model's ``p**a / sum`` (``0**a := 0``, all-zero
sums sample uniformly with ``1/N``), the model's priority, key, data and
``times_sampled``; after every step the table verifies clean, reports the model's size,
holds the model's live keys, and its sum-tree root equals the model's ``sum p**a``
(DESIGN.md invariant 3).

``DeterministicMachine``: samplers ``MinHeap`` / ``MaxHeap`` / ``Lifo`` / ``Fifo``
with removers ``Fifo`` / ``Lifo`` / ``MinHeap`` / ``MaxHeap``: ``sample_batch`` must
return exactly the item the model predicts (heap ties: least recently inserted or
updated), and eviction must remove the item the model's remover picks (Reverb: insert,
then evict, possibly the new item).

Both machines also update several keys in one call (a learner's batch of priorities),
the path where heap and sum-tree fixes are batched.

Each run owns one Server, created by the ``initialize`` rule and stopped in
``teardown`` (which Hypothesis calls even when a step fails). ``database=None``: runs
are not replayed from ``.hypothesis``; a failure prints its falsifying steps, shrunk
only when ``SHMREPLAY_SHRINK=1`` (shrinking a stateful failure takes minutes).

``test_overflowing_weights_do_not_wedge_the_table`` covers the priorities the machines
leave out on purpose: finite priorities whose ``p ** a`` (or sum) overflow float64.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test)

import shmreplay
from shmreplay._engine import buffer as _buffer
from shmreplay._shm import layout as L
from shmreplay import errors, rate_limiters, selectors
from shmreplay.specs import TensorSpec

import _names

TABLE = "t"
SIGNATURE = {"id": TensorSpec((), np.int64)}
REL = 1e-9

# Shrinking a failing run replays it thousands of times (one Server each): minutes. By
# default a failure is reported as found (at most 50 steps, each printed);
# SHMREPLAY_SHRINK=1 shrinks it to a minimal sequence of steps.
_PHASES = tuple(Phase) if os.environ.get("SHMREPLAY_SHRINK") else (
    Phase.explicit, Phase.reuse, Phase.generate, Phase.target)
MACHINE_SETTINGS = settings(
    max_examples=120, stateful_step_count=50, deadline=None, database=None,
    report_multiple_bugs=False, phases=_PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
# Heap bugs need only a few steps but a particular shape: more, shorter runs.
DETERMINISTIC_SETTINGS = settings(MACHINE_SETTINGS, max_examples=250, stateful_step_count=30)

# {0, small, ordinary, large}; 1e-300 ** 1.7 underflows to 0, which the model must follow.
PRIORITIES = st.one_of(
    st.just(0.0),
    st.sampled_from([1e-300, 1e-200, 1e-30, 1e-8, 1e-3]),
    st.floats(0.01, 100.0),
    st.sampled_from([1e6, 1e12, 1e30, 1e100]),
)
# Heaps: ties are the interesting case.
TIE_PRIORITIES = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 3.0))

# Where a key for mutate comes from: a live item, a deleted/evicted/reset one, or noise.
KEY_CHOICES = st.tuples(st.sampled_from(["live", "live", "dead", "random"]),
                        st.integers(0, 2**64 - 1))
LIVE_KEY_CHOICES = st.tuples(st.just("live"), st.integers(0, 2**16))


def weight(priority, exponent):
    """Reverb's ``p ** a`` with ``0 ** a := 0`` (also for ``a == 0``)."""
    return 0.0 if priority == 0.0 else priority ** exponent


@dataclasses.dataclass
class Item:
    key: int
    id: int
    priority: float
    update: int  # update sequence number: heap ties go to the smallest
    times: int = 0


class TableMachine(RuleBasedStateMachine):
    """Model bookkeeping and the rules shared by both machines."""

    sampler = None
    remover = None
    max_size = None

    def __init__(self):
        super().__init__()
        self.server = None
        self.client = None
        self.engine = None
        self.model = {}  # key -> Item, in insertion order (updates do not move items)
        self.dead_keys = []
        self.next_id = 0
        self.update_seq = 0

    def _start(self, sampler, remover, max_size):
        self.sampler, self.remover, self.max_size = sampler, remover, max_size
        table = shmreplay.Table(
            name=TABLE, sampler=sampler, remover=remover, max_size=max_size,
            rate_limiter=rate_limiters.MinSize(1), max_times_sampled=0, signature=SIGNATURE)
        self.server = shmreplay.Server([table], name=_names.unique("sm"))
        self.client = shmreplay.Client(self.server.name)
        self.engine = self.client._buffer.by_name[TABLE]

    def teardown(self):
        try:
            if self.client is not None:
                self.client.close()
        finally:
            if self.server is not None:
                self.server.stop()

    # --- model --------------------------------------------------------------------------

    def _model_insert(self, key, item_id, priority):
        assert key not in self.model and key not in self.dead_keys, f"key {key} reused"
        self.model[key] = Item(key, item_id, priority, self.update_seq)
        self.update_seq += 1
        # Reverb: insert, then evict with the remover while over max_size.
        while len(self.model) > self.max_size:
            self._model_delete(self.select(self.remover).key)

    def _model_delete(self, key):
        del self.model[key]
        self.dead_keys.append(key)

    def select(self, selector):
        """The item a deterministic selector picks."""
        items = list(self.model.values())
        if isinstance(selector, selectors.Fifo):
            return items[0]
        if isinstance(selector, selectors.Lifo):
            return items[-1]
        if isinstance(selector, selectors.MinHeap):
            return min(items, key=lambda item: (item.priority, item.update))
        if isinstance(selector, selectors.MaxHeap):
            return min(items, key=lambda item: (-item.priority, item.update))
        raise AssertionError(f"not deterministic: {selector!r}")

    def _resolve(self, choice):
        source, number = choice
        if source == "live" and self.model:
            return list(self.model)[number % len(self.model)]
        if source == "dead" and self.dead_keys:
            return self.dead_keys[number % len(self.dead_keys)]
        return number

    # --- rules --------------------------------------------------------------------------

    def _insert(self, priority):
        item_id = self.next_id
        self.next_id += 1
        keys = self.client.insert({"id": item_id}, priorities={TABLE: priority}, timeout=1)
        self._model_insert(int(keys[TABLE]), item_id, priority)

    def _insert_batch(self, priorities, scalar):
        ids = np.arange(self.next_id, self.next_id + len(priorities), dtype=np.int64)
        self.next_id += len(priorities)
        if scalar:
            priorities = [priorities[0]] * len(priorities)
            given = priorities[0]
        else:
            given = np.asarray(priorities, np.float64)
        keys = self.client.insert_batch({"id": ids}, priorities={TABLE: given}, timeout=1)[TABLE]
        assert keys.dtype == np.uint64 and keys.shape == (len(ids),)
        assert len(set(keys.tolist())) == len(ids), "duplicate keys in one batch"
        for key, item_id, priority in zip(keys.tolist(), ids.tolist(), priorities):
            self._model_insert(int(key), item_id, float(priority))

    def _mutate(self, updates, deletes):
        update_map = {}
        for choice, priority in updates:
            update_map[self._resolve(choice)] = priority
        delete_keys = [self._resolve(choice) for choice in deletes]
        self.client.mutate_priorities(TABLE, updates=update_map, deletes=delete_keys)
        # Deletes first, then updates; unknown and stale keys are ignored.
        for key in delete_keys:
            if key in self.model:
                self._model_delete(key)
        for key, priority in update_map.items():
            self._model_update(key, priority)

    def _model_update(self, key, priority):
        item = self.model.get(key)
        if item is None:
            return 0
        item.priority = priority
        item.update = self.update_seq
        self.update_seq += 1
        return 1

    def _update_array(self, updates):
        keys = np.array([self._resolve(choice) for choice, _ in updates], np.uint64)
        prios = np.array([priority for _, priority in updates], np.float64)
        updated = self.client.update_priorities(TABLE, keys, prios)
        # Every occurrence of a live key counts (duplicates too: last writer wins).
        expected = sum(self._model_update(int(key), float(p)) for key, p in zip(keys, prios))
        assert updated == expected

    def _sample_empty(self):
        with pytest.raises(errors.DeadlineExceededError):
            self.client.sample_batch(TABLE, batch_size=1, timeout=0)

    def _check_row_common(self, sample, row):
        info = sample.info
        key = int(info.key[row])
        assert key in self.model, f"sampled key {key} is not live in the model"
        item = self.model[key]
        assert int(sample.data["id"][row]) == item.id, "data does not belong to the key"
        assert float(info.priority[row]) == item.priority
        assert int(info.table_size[row]) == len(self.model)
        item.times += 1
        assert int(info.times_sampled[row]) == item.times
        return item

    def _reset(self):
        self.client.reset(TABLE)
        self.dead_keys.extend(self.model)
        self.model.clear()

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def table_verifies_clean(self):
        assert self.client.verify(TABLE) == []

    @invariant()
    def size_matches_model(self):
        info = self.client.server_info()[TABLE]
        assert info.current_size == len(self.model)

    @invariant()
    def live_keys_match_model(self):
        """White-box: the keys of the live slots, in insertion order, are the model's."""
        ctrl, meta = self.engine.ctrl, self.engine.meta
        keys = []
        slot = int(ctrl[L.C_HEAD])
        while slot >= 0 and len(keys) <= len(self.model):
            keys.append(int(meta[slot, L.M_KEY]))  # meta[slot, field] (_layout)
            slot = int(meta[slot, L.M_NEXT])
        assert keys == list(self.model)


class PrioritizedMachine(TableMachine):

    @initialize(exponent=st.sampled_from([0.0, 0.5, 1.0, 1.7]), max_size=st.integers(5, 12))
    def start(self, exponent, max_size):
        self.exponent = exponent
        self._start(selectors.Prioritized(exponent), selectors.Fifo(), max_size)

    def weights(self):
        return {key: weight(item.priority, self.exponent) for key, item in self.model.items()}

    @rule(priority=PRIORITIES)
    def insert(self, priority):
        self._insert(priority)

    @rule(priorities=st.lists(PRIORITIES, min_size=1, max_size=15), scalar=st.booleans())
    def insert_batch(self, priorities, scalar):
        self._insert_batch(priorities, scalar)

    @rule(updates=st.lists(st.tuples(KEY_CHOICES, PRIORITIES), max_size=6),
          deletes=st.lists(KEY_CHOICES, max_size=3))
    def mutate_priorities(self, updates, deletes):
        self._mutate(updates, deletes)

    @rule(updates=st.lists(st.tuples(KEY_CHOICES, PRIORITIES), min_size=1, max_size=6))
    def update_priorities(self, updates):
        self._update_array(updates)

    @precondition(lambda self: len(self.model) >= 2)
    @rule(updates=st.lists(st.tuples(LIVE_KEY_CHOICES, PRIORITIES), min_size=2, max_size=8))
    def update_several_live_items(self, updates):
        """A learner's batch of new priorities: several live keys in one call."""
        self._update_array(updates)

    @precondition(lambda self: not self.model)
    @rule()
    def sample_empty_times_out(self):
        self._sample_empty()

    @precondition(lambda self: self.model)
    @rule(batch_size=st.integers(1, 16))
    def sample_batch(self, batch_size):
        sample = self.client.sample_batch(TABLE, batch_size=batch_size, timeout=1)
        assert len(sample.info.key) == batch_size
        weights = self.weights()
        total = math.fsum(weights.values())
        for row in range(batch_size):
            item = self._check_row_common(sample, row)
            if total > 0.0:
                assert weights[item.key] > 0.0, (
                    f"drew key {item.key} with priority {item.priority} (weight 0) while the "
                    f"total weight is {total}")
                expected = weights[item.key] / total
            else:
                expected = 1.0 / len(self.model)
            assert float(sample.info.probability[row]) == pytest.approx(expected, rel=REL), (
                f"row {row}: priority {item.priority}, exponent {self.exponent}")

    @precondition(lambda self: self.model)
    @rule()
    def reset(self):
        self._reset()

    @invariant()
    def sum_tree_root_is_sum_of_weights(self):
        root = float(self.client._buffer.by_name[TABLE].arrays[4][0][1])
        assert root == pytest.approx(math.fsum(self.weights().values()), rel=REL, abs=0.0)


DETERMINISTIC = [selectors.Fifo(), selectors.Lifo(), selectors.MinHeap(), selectors.MaxHeap()]


class DeterministicMachine(TableMachine):

    @initialize(sampler=st.sampled_from(DETERMINISTIC), remover=st.sampled_from(DETERMINISTIC),
                max_size=st.integers(5, 12))
    def start(self, sampler, remover, max_size):
        self._start(sampler, remover, max_size)

    @rule(priority=TIE_PRIORITIES)
    def insert(self, priority):
        self._insert(priority)

    @rule(priorities=st.lists(TIE_PRIORITIES, min_size=1, max_size=15), scalar=st.booleans())
    def insert_batch(self, priorities, scalar):
        self._insert_batch(priorities, scalar)

    @rule(updates=st.lists(st.tuples(KEY_CHOICES, TIE_PRIORITIES), max_size=6),
          deletes=st.lists(KEY_CHOICES, max_size=3))
    def mutate_priorities(self, updates, deletes):
        self._mutate(updates, deletes)

    @precondition(lambda self: self.model)
    @rule(choice=KEY_CHOICES)
    def touch_without_changing_priority(self, choice):
        """Re-setting the same priority still makes the item the most recently updated."""
        key = self._resolve(("live", choice[1]))
        self._mutate([(("given", key), self.model[key].priority)], [])

    @rule(updates=st.lists(st.tuples(KEY_CHOICES, TIE_PRIORITIES), min_size=1, max_size=6))
    def update_priorities(self, updates):
        self._update_array(updates)

    @precondition(lambda self: len(self.model) >= 2)
    @rule(updates=st.lists(st.tuples(LIVE_KEY_CHOICES, TIE_PRIORITIES), min_size=2, max_size=8))
    def update_several_live_items(self, updates):
        """A learner's batch of new priorities: several live keys in one call."""
        self._update_array(updates)

    def _resolve(self, choice):
        if choice[0] == "given":
            return choice[1]
        return super()._resolve(choice)

    @precondition(lambda self: not self.model)
    @rule()
    def sample_empty_times_out(self):
        self._sample_empty()

    @precondition(lambda self: self.model)
    @rule(batch_size=st.integers(1, 3))
    def sample_batch(self, batch_size):
        expected = self.select(self.sampler)
        sample = self.client.sample_batch(TABLE, batch_size=batch_size, timeout=1)
        assert len(sample.info.key) == batch_size
        for row in range(batch_size):
            assert int(sample.info.key[row]) == expected.key, (
                f"{self.sampler!r} sampled key {int(sample.info.key[row])} "
                f"(priority {float(sample.info.priority[row])}); the model expects "
                f"{expected.key} (priority {expected.priority})")
            self._check_row_common(sample, row)
            assert float(sample.info.probability[row]) == 1.0

    @precondition(lambda self: self.model)
    @rule()
    def reset(self):
        self._reset()


def test_prioritized_table_matches_model():
    run_state_machine_as_test(PrioritizedMachine, settings=MACHINE_SETTINGS)


def test_deterministic_selectors_match_model():
    run_state_machine_as_test(DeterministicMachine, settings=DETERMINISTIC_SETTINGS)


# --------------------------------------------------------------------------------------
# Priorities the client accepts (finite, >= 0) whose weights overflow float64
# --------------------------------------------------------------------------------------

_OVERFLOW_CHILD = r"""
import json, sys
import numpy as np
import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay.specs import TensorSpec

name, exponent, priorities = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
table = shmreplay.Table(name="t", sampler=selectors.Prioritized(exponent),
                        remover=selectors.Fifo(), max_size=8,
                        rate_limiter=rate_limiters.MinSize(1),
                        signature={"id": TensorSpec((), np.int64)})
with shmreplay.Server([table], name=name):
    client = shmreplay.Client(name)
    try:
        for i, priority in enumerate(priorities):
            client.insert({"id": i}, priorities={"t": priority}, timeout=1)
    except errors.InvalidPriorityError as exc:
        print(json.dumps({"rejected": str(exc)}), flush=True)
    else:
        print(json.dumps({"inserted": True}), flush=True)
        sample = client.sample_batch("t", 4, timeout=1)
        print(json.dumps({"probability": sample.info.probability.tolist(),
                          "verify": client.verify("t")}), flush=True)
    client.close()
"""

OVERFLOW_CASES = {
    # 1e300 ** 1.7 is inf: one item's weight overflows.
    "pow-overflows": (1.7, [1e300, 1.0]),
    # Each weight is finite, their sum is inf.
    "sum-overflows": (1.0, [1e308, 1e308, 1.0]),
}


def test_overflowing_weights_do_not_wedge_the_table():
    """Accepted priorities whose ``p ** a`` (or sum) overflow must not hang ``sample``.

    Either the insert is refused (InvalidPriorityError) or sampling returns finite
    probabilities. Each case runs in a child process, killed if it hangs: a sampler
    spinning inside a kernel holds the table's lock and cannot be interrupted.
    """
    children = {}
    try:
        for case, (exponent, priorities) in OVERFLOW_CASES.items():
            name = _names.unique("sm")
            children[case] = (name, subprocess.Popen(
                [sys.executable, "-c", _OVERFLOW_CHILD, name, str(exponent),
                 json.dumps(priorities)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 8.0
        outcomes = {}
        for case, (name, child) in children.items():
            try:
                out, err = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
                outcomes[case] = (child.returncode, out, err)
            except subprocess.TimeoutExpired:
                child.kill()
                out, err = child.communicate()
                outcomes[case] = ("hung", out, err)
    finally:
        for name, child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
            _buffer.unlink_all(name, 1)  # a killed child could not stop its Server
    problems = []
    for case, (status, out, err) in outcomes.items():
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if status == "hung":
            problems.append(f"{case}: sample_batch never returned (after {lines})")
            continue
        if status != 0:
            problems.append(f"{case}: child failed ({status}): {err[-500:]}")
            continue
        result = lines[-1]
        if "rejected" in result:
            continue
        probabilities = np.array(result["probability"])
        if not (np.isfinite(probabilities).all() and (probabilities > 0).all()
                and (probabilities <= 1).all()) or result["verify"]:
            problems.append(f"{case}: {result}")
    assert not problems, "\n".join(problems)
