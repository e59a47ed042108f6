"""Why item_exact's ``acme_structured_nstep3`` differs: a strided pattern slice on
DeepMind Reverb 0.14.0 reads contiguous steps once its cells share a chunk.

    TF_CPP_MIN_LOG_LEVEL=3 /work/reverb-venv/bin/python \\
        benchmarks/compat/strided_slice_repro.py --backend reverb
    PYTHONPATH=$PWD /work/compat-venv/bin/python \\
        benchmarks/compat/strided_slice_repro.py --backend shmreplay

One StructuredWriter writes episodes the way Acme's StructuredAdder does (a partial
step with the observation, then the reward), with the configs of Acme's
``create_n_step_transition_config(n_step=3)`` reduced to two fields. The item written
at step 2 of each episode has the pattern ``observation[-3::2]`` (steps 0 and 2) and
``reward[-3:-1]`` (steps 0 and 1). Printed per episode: the observations of that item;
expected ``[100e, 100e + 2]``. On Reverb 0.14.0 the episodes after the chunker's
auto-tuned chunk length grows past one step give ``[100e, 100e + 1]``: its
TrajectoryWriter merges the cells of a column that share a chunk into one slice of
consecutive offsets (``MergeAdjacent`` in ``reverb/cc/trajectory_writer.cc``), whatever
the slice's step.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["reverb", "shmreplay"], required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[5, 5, 5, 5])
    args = parser.parse_args()
    if args.backend == "shmreplay":
        sys.path.insert(0, os.path.join(HERE, "shim"))
    import reverb
    import tensorflow as tf
    from reverb import structured_writer as sw

    spec = {"o": tf.TensorSpec([], tf.float32), "r": tf.TensorSpec([], tf.float32)}
    ref = sw.create_reference_step(spec)

    def pattern(n):
        return {"o": ref["o"][-(n + 1)::n], "r": ref["r"][-(n + 1):-1]}

    configs = [sw.create_config(pattern(n), "t", conditions=[sw.Condition.step_index() == n])
               for n in (1, 2)] + [sw.create_config(pattern(3), "t")]
    server = reverb.Server([reverb.Table.queue("t", 1000)], port=None)
    try:
        client = reverb.Client(f"localhost:{server.port}")
        writer = client.structured_writer(configs)
        for episode, length in enumerate(args.lengths):
            for t in range(length + 1):
                writer.append({"o": np.float32(100 * episode + t), "r": None},
                              partial_step=True)
                if t < length:
                    writer.append({"o": None, "r": np.float32(100 * episode + t + 0.5)})
            writer.append({"o": None, "r": np.float32(0)})  # as Acme's last, dummy step
            writer.end_episode(clear_buffers=True)
        writer.flush()
        size = client.server_info()["t"].current_size
        items = client.sample("t", num_samples=size, emit_timesteps=False)
        # No signature: each item is its flat list of columns, "o" then "r".
        for observations, rewards in sorted(
                ([float(x) for x in s.data[0]], [float(x) for x in s.data[1]])
                for s in items):
            if len(rewards) == 2 and rewards[0] % 100 == 0.5:  # the step-2 item
                episode = int(observations[0]) // 100
                verdict = "ok" if observations[1] == observations[0] + 2 else "WRONG"
                print(f"episode {episode}: observation {observations}, "
                      f"reward {rewards}: {verdict}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
