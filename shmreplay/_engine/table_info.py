"""``TableInfo`` records: a table's configuration and counters as Reverb reports them.

``make_info`` builds one from a table's configuration and a snapshot of its control
words; ``count_episodes`` counts the distinct episodes among a table's items (lazily,
from the episode records writers leave in its slots: ``shmreplay._shm.layout``) and those
that left (``shmreplay._writers.episode_stays``).
"""

import sys

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import specs
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay.replay_sample import (RateLimiterCallStats, RateLimiterInfo, SelectorOptions,
                                     TableInfo)


def make_info(config, counters, num_episodes: int = 0,
              num_deleted_episodes: int = 0) -> TableInfo:
    """The ``TableInfo`` of a table with configuration ``config`` and control words
    ``counters`` (all zeros for a table no server owns yet)."""
    limiter = config.rate_limiter
    c = counters
    return TableInfo(
        name=config.name,
        sampler_options=SelectorOptions(config.sampler.options),
        remover_options=SelectorOptions(config.remover.options),
        max_size=config.max_size,
        max_times_sampled=config.max_times_sampled,
        rate_limiter_info=RateLimiterInfo(
            samples_per_insert=limiter.samples_per_insert,
            min_diff=limiter.min_diff,
            max_diff=limiter.max_diff,
            min_size_to_sample=limiter.min_size_to_sample,
            insert_stats=RateLimiterCallStats(int(c[L.C_INSERTS])),
            sample_stats=RateLimiterCallStats(int(c[L.C_SAMPLES])),
            delete_stats=RateLimiterCallStats(int(c[L.C_DELETES]))),
        signature=reported_signature(config.signature),
        current_size=int(c[L.C_SIZE]),
        num_episodes=num_episodes,
        num_deleted_episodes=num_deleted_episodes,
        num_unique_samples=int(c[L.C_NUM_UNIQUE]),
        num_inserted=int(c[L.C_TOTAL_INSERTED]),
        num_sampled=int(c[L.C_TOTAL_SAMPLED]),
        num_deleted=int(c[L.C_TOTAL_DELETED]))


def static_info(config) -> TableInfo:
    """The info of a table that no server owns yet (all counters zero)."""
    return make_info(config, np.zeros(L.CTRL_WORDS, np.int64))


def reported_signature(signature):
    """The signature as the user gave it: leaves given as ``tf.TensorSpec`` become
    ``tf.TensorSpec`` again if this process has imported TensorFlow (never imported
    here: an actor without TensorFlow gets ``shmreplay.TensorSpec``)."""
    if signature is None:
        return None
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "TensorSpec"):
        return signature

    def as_given(spec):
        if not spec.from_tf:
            return spec
        return tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype), spec.name)

    return specs.optree.tree_map(as_given, signature, none_is_leaf=False)


def count_episodes(engine, counters, deadline=None, timeout=None):
    """``(live, deleted)``: the number of distinct episodes among ``engine``'s live items
    (``counters``: its control words, read just before), and of episodes whose stay in
    the table ended since the last reset, as Reverb counts them: started
    (``C_TOTAL_INSERTED - C_EPISODE_REPEATS``) and not live now. Waits for the lock up
    to ``deadline``."""
    if not counters[L.C_EPISODES_RECORDED]:  # no writer ever wrote here: each its own
        live = int(counters[L.C_SIZE])
        return live, _left(counters[L.C_TOTAL_INSERTED] - counters[L.C_EPISODE_REPEATS], live)
    from shmreplay._shm.kernels import episodes as kernels
    room = int(engine.ctrl[L.C_SIZE]) + 64
    stays = np.zeros(1, np.int64)
    while True:
        out = np.empty(room, np.int64)
        count = _lock_waits.call(engine, deadline, timeout, "info", kernels.live_episodes,
                                 engine.episodes, out, stays)
        if count >= 0:
            break
        if count > -1000:
            engine._raise_status(count)
        room = -count - 1000 + 64  # grew meanwhile
    live = 0
    if count:
        ids = out[:count]
        ids.sort()
        live = int(1 + np.count_nonzero(ids[1:] != ids[:-1]))
    return live, _left(stays[0], live)


def _left(started, live: int) -> int:
    # Never below 0: a crash inside a commit may leave the count one short.
    return max(0, int(started) - live)
