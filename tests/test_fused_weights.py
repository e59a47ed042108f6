"""Importance weights computed by the sampling call (``batch_outputs.Weighing``).

Once two calls in a row ask a table handle for the same ``(beta, normalize)``, each
reused small batch comes with its weights, computed by ``sample_gather``; these tests
check that they are the weights ``SampleInfo.importance_weights`` computes, that that
is the path taken (the array handed out is the batch's own memory, where the general
path makes a new one), that each call gets an array of its own, and that a beta that
changes at every call (annealed) never takes that path.
"""

import pickle

import numpy as np
import pytest

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay.replay_sample import SampleInfo
import _names


def _server(capacity, exponent, tag):
    table = shmreplay.Table("t", selectors.Prioritized(exponent), selectors.Fifo(), capacity,
                            rate_limiters.MinSize(1))
    return shmreplay.Server([table], name=_names.unique(tag))


def _fill(client, capacity, rng):
    client.insert_batch({"obs": rng.standard_normal((capacity, 3)).astype(np.float32)},
                        {"t": rng.random(capacity) * 10 + 0.01})


def _unfused(info, beta, normalize):
    """The general path's weights, from a plain ``SampleInfo`` of copies."""
    plain = SampleInfo(*(np.array(field) for field in info))
    return plain.importance_weights(beta, normalize)


def _fused(sample, weights):
    """Whether ``weights`` are the ones the sampling call computed (the batch's memory)."""
    return weights.base is not None and weights.base is sample.info.probability.base


@pytest.mark.parametrize("capacity,exponent", [(10, 0.4), (100, 1.0), (1000, 0.6)])
def test_fused_weights_equal_the_general_paths(capacity, exponent):
    rng = np.random.default_rng(capacity)
    with _server(capacity, exponent, "fused") as server, shmreplay.Client(server.name) as client:
        _fill(client, capacity, rng)
        for batch_size in (1, 2, 32, 256):
            for beta in (0.0, 0.4, 1.0, 1.7):
                for normalize in (True, False):
                    fused = 0
                    for _ in range(4):
                        sample = client.sample_batch("t", batch_size)
                        weights = sample.info.importance_weights(beta, normalize)
                        assert weights.dtype == np.float32 and weights.shape == (batch_size,)
                        np.testing.assert_array_equal(
                            weights, _unfused(sample.info, beta, normalize))
                        fused += _fused(sample, weights)
                    # The first two calls with a new pair compute it; then the sampling
                    # call does.
                    assert fused >= 2, (batch_size, beta, normalize)


def test_each_call_gets_an_array_of_its_own():
    rng = np.random.default_rng(1)
    with _server(100, 0.6, "fusedown") as server, shmreplay.Client(server.name) as client:
        _fill(client, 100, rng)
        for _ in range(3):
            client.sample_batch("t", 8).info.importance_weights(0.5)
        sample = client.sample_batch("t", 8)
        first = sample.info.importance_weights(0.5)
        assert _fused(sample, first)
        expected = first.copy()
        first *= 0.0  # the caller's to change
        second = sample.info.importance_weights(0.5)
        assert second is not first and not _fused(sample, second)
        np.testing.assert_array_equal(second, expected)
        # Weights held keep their batch: later batches never write into them.
        held = [client.sample_batch("t", 8) for _ in range(2)]
        kept = [(s, s.info.importance_weights(0.5)) for s in held]
        copies = [w.copy() for _, w in kept]
        del held
        for _ in range(20):
            client.sample_batch("t", 8).info.importance_weights(0.5)
        for (_, weights), copy in zip(kept, copies):
            np.testing.assert_array_equal(weights, copy)


def test_weights_alone_held_keep_their_batch():
    rng = np.random.default_rng(2)
    with _server(100, 0.6, "fusedhold") as server, shmreplay.Client(server.name) as client:
        _fill(client, 100, rng)
        for _ in range(3):
            client.sample_batch("t", 4).info.importance_weights(0.5)
        held = []
        for _ in range(10):
            sample = client.sample_batch("t", 4)
            weights = sample.info.importance_weights(0.5)
            held.append((weights, weights.copy()))
            del sample
        for weights, copy in held:
            np.testing.assert_array_equal(weights, copy)


def test_an_annealed_beta_never_takes_the_fused_path():
    rng = np.random.default_rng(3)
    with _server(100, 0.6, "fusedanneal") as server, shmreplay.Client(server.name) as client:
        _fill(client, 100, rng)
        for beta in np.linspace(0.4, 1.0, 30):
            sample = client.sample_batch("t", 4)
            weights = sample.info.importance_weights(float(beta))
            assert not _fused(sample, weights)
            np.testing.assert_array_equal(weights, _unfused(sample.info, float(beta), True))
        # A beta asked twice in a row is fused again from then on.
        fused = []
        for _ in range(4):
            sample = client.sample_batch("t", 4)
            fused.append(_fused(sample, sample.info.importance_weights(1.0)))
        assert fused == [False, True, True, True]


def test_a_batch_info_is_a_sample_info_in_repr_pickle_and_replace():
    rng = np.random.default_rng(4)
    with _server(100, 0.6, "fusedinfo") as server, shmreplay.Client(server.name) as client:
        _fill(client, 100, rng)
        for _ in range(3):
            client.sample_batch("t", 4).info.importance_weights(0.5)
        info = client.sample_batch("t", 4).info
        assert isinstance(info, SampleInfo)
        assert repr(info).startswith("SampleInfo(key=array(")
        back = pickle.loads(pickle.dumps(info))
        assert type(back) is SampleInfo
        for mine, theirs in zip(info, back):
            np.testing.assert_array_equal(mine, theirs)
        # Changed fields: the weights of the new values.
        changed = info._replace(probability=info.probability / 2)
        np.testing.assert_array_equal(changed.importance_weights(0.5, False),
                                      _unfused(changed, 0.5, False))


def test_bad_betas_raise_as_before():
    rng = np.random.default_rng(5)
    with _server(100, 0.6, "fusedbad") as server, shmreplay.Client(server.name) as client:
        _fill(client, 100, rng)
        for _ in range(3):
            client.sample_batch("t", 4).info.importance_weights(0.5)
        info = client.sample_batch("t", 4).info
        with pytest.raises(ValueError):
            info.importance_weights("a lot")
        with pytest.raises(TypeError):
            info.importance_weights(None)
        assert np.isnan(info.importance_weights(float("nan"))).all()
        with pytest.raises(TypeError):
            info.importance_weights(np.array([0.5, 0.6]))
        with pytest.raises(ValueError):
            info.importance_weights(0.5, normalize=np.array([True, False]))
        # A beta of another numeric type is the same beta.
        for _ in range(3):
            sample = client.sample_batch("t", 4)
            weights = sample.info.importance_weights(np.float32(0.5))
        assert _fused(sample, weights)
        np.testing.assert_array_equal(weights, _unfused(sample.info, np.float32(0.5), True))


def test_large_batches_take_the_general_path():
    rng = np.random.default_rng(6)
    with _server(8192, 0.6, "fusedlarge") as server, shmreplay.Client(server.name) as client:
        _fill(client, 8192, rng)
        for _ in range(3):
            sample = client.sample_batch("t", 4096)
            weights = sample.info.importance_weights(0.5)
            assert not _fused(sample, weights)
            np.testing.assert_array_equal(weights, _unfused(sample.info, 0.5, True))


def test_threads_sharing_a_handle_get_their_own_batches_weights():
    import threading
    rng = np.random.default_rng(7)
    with _server(500, 0.6, "fusedthreads") as server, shmreplay.Client(server.name) as client:
        _fill(client, 500, rng)
        failures = []

        def learner():
            try:
                for _ in range(300):
                    sample = client.sample_batch("t", 4)
                    weights = sample.info.importance_weights(0.5)
                    expected = _unfused(sample.info, 0.5, True)
                    if not np.array_equal(weights, expected):
                        failures.append((weights.copy(), expected))
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=learner) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures, failures[:3]
