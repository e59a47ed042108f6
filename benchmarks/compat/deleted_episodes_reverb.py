"""Drives Reverb through the random operations of tests/test_deleted_episodes.py and
compares TableInfo's num_episodes and num_deleted_episodes with the test's ReverbModel
after every operation. Run with a Python that has dm-reverb:

    python benchmarks/compat/deleted_episodes_reverb.py tests

On 2026-11-27, Reverb 0.14: 300 operations, 0 mismatches (final counts (5, 16)).
"""
import collections, random, sys
import numpy as np
import reverb
import tensorflow as tf
source = open(sys.argv[1] + "/test_deleted_episodes.py").read()
start = source.index("class ReverbModel")
exec(source[start:source.index("\n\n\ndef ", start)])  # the test's model, unchanged

rng = random.Random(20261127)
model = ReverbModel(max_size=6)
server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                                     max_size=6, rate_limiter=reverb.rate_limiters.MinSize(1))])
client = reverb.Client(f"localhost:{server.port}")
writers = {w: client.trajectory_writer(1) for w in "AB"}
episode_of = {"A": 0, "B": 0}
number = 0
mismatches = 0
def counts():
    info = client.server_info()["t"]
    return info.num_episodes, info.num_deleted_episodes
def keys_by_number():
    found = {}
    for s in client.sample("t", 400):
        found[int(np.ravel(s[0].data[0])[0])] = int(s[0].info.key)
    return found
for i in range(300):
    op = rng.choices(["insert", "step", "end", "delete", "reset"], [3, 10, 2, 3, 0.3])[0]
    if op == "insert":
        number += 1
        client.insert({"x": np.array([number, 0], np.float32)}, {"t": 1.0})
        model.add(number, ("insert", number))
    elif op == "step":
        w = rng.choice("AB"); number += 1
        writer = writers[w]
        writer.append({"x": np.array([number, 0], np.float32)})
        writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
        writer.flush()
        model.add(number, (w, episode_of[w]))
    elif op == "end":
        w = rng.choice("AB")
        writers[w].end_episode()
        episode_of[w] += 1
    elif op == "delete" and model.items:
        victim = rng.choice(list(model.items))
        keys = keys_by_number()
        assert set(keys) == set(model.items), (keys, list(model.items))
        client.mutate_priorities("t", deletes=[keys[victim]])
        model.remove(victim)
    elif op == "reset":
        client.reset("t")
        model.reset()
    if counts() != model.counts():
        mismatches += 1
        print("mismatch at", i, op, counts(), model.counts())
print("ops 300, mismatches", mismatches, "final reverb", counts(), "model", model.counts())
