"""Padded batches of items of any length for learners (issue 19, point 3):
``Client.sample_batch(pad_to=)`` and full batches made of several calls' parts.
"""

import threading
import time

import numpy as np
import pytest

import _any_length_workers as W
import shmreplay
from shmreplay import _batches, rate_limiters, selectors


def _table(name="eps"):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), 100,
                           rate_limiters.MinSize(1), signature=W.SIGNATURE)


def _check_rows(batch, width, written):
    """Each row: a written episode (``{first step: length}``) whole, zeros up to ``width``."""
    assert batch.data["obs"].shape[1:] == (width, 4) and batch.data["step"].shape[1] == width
    assert (batch.lengths["obs"] == batch.lengths["step"]).all()
    for obs, step, n in zip(batch.data["obs"], batch.data["step"], batch.lengths["step"]):
        assert written[int(step[0])] == n
        assert (step[:n] == np.arange(step[0], step[0] + n)).all() and (obs[:n] == step[:n, None]).all()
        assert (step[n:] == 0).all() and (obs[n:] == 0).all()


def test_sample_batch_pads_to_pad_to(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [3, 7, 1], base=100)
        batch = client.sample_batch("eps", 32, timeout=5, pad_to=10)
        assert isinstance(batch, shmreplay.PaddedSample)
        _check_rows(batch, 10, {100: 3, 103: 7, 110: 1})
        assert shmreplay.PaddedSample.mask(batch.lengths["step"], 10).sum() == \
            batch.lengths["step"].sum()
        exact = client.sample_batch("eps", 8, timeout=5, pad_to=7)  # the longest: fits
        _check_rows(exact, 7, {100: 3, 103: 7, 110: 1})
        with pytest.raises(ValueError, match=r"Table 'eps': pad_to=5, but a sampled item "
                                             r"has 7 steps"):
            client.sample_batch("eps", 64, timeout=5, pad_to=5)
        client.close()


def test_a_wrong_pad_to_is_refused_before_sampling(buffer_name):
    fixed = shmreplay.Table("fixed", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([_table(), fixed], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [3], base=0)
        client.insert({"x": np.zeros(2, np.float32)}, {"fixed": 1.0})
        for bad in (0, -3, 2.5, True):
            with pytest.raises(ValueError, match="pad_to must be an integer >= 1"):
                client.sample_batch("eps", 4, timeout=1, pad_to=bad)
        with pytest.raises(ValueError, match="'fixed'.*fixed shapes, so leave pad_to out"):
            client.sample_batch("fixed", 4, timeout=1, pad_to=4)
        # Nothing was sampled by the refused calls.
        assert client.sample_batch("eps", 1, timeout=1).info.times_sampled.tolist() == [1]
        assert client.sample_batch("fixed", 1, timeout=1).info.times_sampled.tolist() == [1]
        client.close()


def test_a_full_batch_made_of_parts_of_different_widths_is_padded_to_the_longest(
        buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 10, signature=W.SIGNATURE)],
                          name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "q", [2], base=0)

        def write_later():
            time.sleep(0.3)  # after the first call took the first item
            other = shmreplay.Client(buffer_name)
            W.write_episodes(other, "q", [9], base=50)
            other.close()
        writer = threading.Thread(target=write_later)
        writer.start()
        batch = _batches.full_batch(client, "q", 2, timeout=5)
        writer.join(timeout=5)
        assert batch.lengths["step"].tolist() == [2, 9]  # two calls: widths 2 and 9
        _check_rows(batch, 9, {0: 2, 50: 9})
        assert batch.info.key.shape == (2,)
        client.close()
