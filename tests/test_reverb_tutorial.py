"""The steps of Reverb's README tutorial, as a Reverb user writes them with
``import shmreplay as reverb`` (issue 17; ``benchmarks/compat/user_scripts.py`` runs the
README itself): one table takes an inserted ``[0, 1]`` and a 3-step dict item from a
``trajectory_writer``, ``sample`` gives each in its own structure, and a checkpoint made
through ``reverb.platform.checkpointers_lib`` restores both into a new server.
"""

import numpy as np

import shmreplay as reverb


def _tables():
    return [reverb.Table(name="my_table", sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=100,
                         rate_limiter=reverb.rate_limiters.MinSize(1))]


def _items(client):
    """Both items, as ``Client.sample`` gives them (flat data, one list per item)."""
    got = {}
    for _ in range(500):  # (uniform: until both came; 2**-500 that one never does)
        for sample in client.sample("my_table", num_samples=1, emit_timesteps=False):
            got[int(sample.info.key)] = [np.asarray(column) for column in sample.data]
        if len(got) == 2:
            break
    return [got[key] for key in sorted(got)]


def _check(items):
    inserted, written = items
    assert [column.tolist() for column in inserted] == [[0], [1]]
    assert [column.tolist() for column in written] == [[2, 3, 4], [12, 13, 14]]


def test_the_tutorial_runs_and_its_checkpoint_restores(tmp_path):
    server = reverb.Server(tables=_tables())
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert([0, 1], priorities={"my_table": 1.0})
        with client.trajectory_writer(num_keep_alive_refs=3) as writer:
            for a, b in ((2, 12), (3, 13), (4, 14)):
                writer.append({"a": a, "b": b})
            writer.create_item(table="my_table", priority=1.0, trajectory={
                "a": writer.history["a"][:], "b": writer.history["b"][:]})
            writer.flush()
        _check(_items(client))
        path = client.checkpoint()
    finally:
        server.stop()
    checkpointer = reverb.platform.checkpointers_lib.DefaultCheckpointer(
        path=path.rsplit("/", 1)[0])
    assert isinstance(checkpointer, reverb.checkpointers.DefaultCheckpointer)
    restored = reverb.Server(tables=_tables(), checkpointer=checkpointer)
    try:
        client = reverb.Client(f"localhost:{restored.port}")
        assert client.server_info()["my_table"].current_size == 2
        _check(_items(client))
    finally:
        restored.stop()
