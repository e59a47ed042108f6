"""CartPole with DQN: Ray actors on two other nodes feed a JAX learner's buffer.

* This process owns the buffer (``_cartpole.make_server``) and starts a
  ``shmreplay.ray.BufferService`` on its node.
* Actors are Ray actors placed on the *other* nodes of the cluster. They step
  gymnasium's CartPole and write transitions through the service's ``RemoteClient``
  with a remote ``trajectory_writer`` (chunks of 64 items); they read the learner's
  latest network from the ``params`` table the same way (``sample_batch``).
* The learner is ``jax_dqn.learner``, unchanged: a process on this node that samples
  the buffer from shared memory.

Run it::

    pip install -e '.[examples,ray]' && python examples/ray_actors.py

Without ``--address`` it starts a cluster on this machine (Ray's ``cluster_utils``:
a head node, this one, and two worker nodes of 1 CPU each) and stops it at the end.
It prints a progress line every second and stops once the average return of the last
20 episodes reaches ``--target`` (exit status 0) or after ``--seconds`` (exit status 1).
"""

import argparse
import collections
import multiprocessing
import os
import queue
import sys
import threading
import time

import numpy as np

from _cartpole import GAMMA, WINDOW, make_server, q_values

MB = 2 ** 20


def _transition(writer):
    history = writer.history
    writer.create_item("replay", 1.0, {
        "obs": history["obs"][-2], "action": history["action"][-2],
        "reward": history["reward"][-2], "discount": history["discount"][-2],
        "next_obs": history["obs"][-1]})


class CartPoleActor:
    """A Ray actor (made remote in ``main``): epsilon-greedy CartPole episodes."""

    def __init__(self, remote, seed):
        self.remote, self.seed = remote, seed
        self.returns, self.steps = [], 0
        self.stopped = threading.Event()

    def node(self):
        import ray
        return ray.get_runtime_context().get_node_id()

    def progress(self):
        returns, self.returns = self.returns, []
        return returns, self.steps

    def stop(self):
        self.stopped.set()

    def run(self):
        import gymnasium as gym
        import shmreplay
        env = gym.make("CartPole-v1")
        rng = np.random.default_rng(self.seed)
        params = None
        with self.remote.trajectory_writer(2, chunk_items=64) as writer:
            while not self.stopped.is_set():
                obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
                episode_return, done = 0.0, False
                while not done and not self.stopped.is_set():
                    if self.steps % 200 == 0:  # the learner's latest network
                        try:
                            latest = self.remote.sample_batch("params", 1, timeout=0).data
                            params = {k: v[0] for k, v in latest.items()}
                        except shmreplay.DeadlineExceededError:
                            pass
                    epsilon = max(0.05, 1.0 - self.steps / 5_000)
                    if params is None or rng.random() < epsilon:
                        action = int(rng.integers(2))
                    else:
                        action = int(np.argmax(q_values(params, obs.astype(np.float32))))
                    next_obs, reward, terminated, truncated, _ = env.step(action)
                    writer.append({"obs": obs.astype(np.float32), "action": action,
                                   "reward": np.float32(reward),
                                   "discount": np.float32(0.0 if terminated else GAMMA)})
                    if writer.episode_steps >= 2:
                        _transition(writer)
                    obs, done = next_obs, terminated or truncated
                    episode_return += reward
                    self.steps += 1
                if done:
                    writer.append({"obs": obs.astype(np.float32), "action": 0,
                                   "reward": np.float32(0), "discount": np.float32(0)})
                    _transition(writer)
                    try:  # waits while the learner is behind (the rate limiter)
                        writer.end_episode(timeout_ms=1_000)
                    except shmreplay.DeadlineExceededError:
                        pass  # the chunk goes again with the next one
                    self.returns.append(episode_return)
        return self.steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", help="an existing Ray cluster (default: start one)")
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--target", type=float, default=475)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    import shmreplay.ray
    from jax_dqn import learner

    nodes = None
    if args.address is None:
        from ray.cluster_utils import Cluster
        nodes = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "object_store_memory": 100 * MB})
        for _ in range(2):
            nodes.add_node(num_cpus=1, object_store_memory=100 * MB)
    here = os.path.dirname(os.path.abspath(__file__))  # workers import this folder
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    ray.init(address=args.address or nodes.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    spawn = multiprocessing.get_context("spawn")
    stop, stats = spawn.Event(), spawn.Queue()
    server = service = learner_process = None
    actors, runs, code = [], [], 1
    try:
        if nodes is not None:
            nodes.wait_for_nodes(timeout=120)
        this = ray.get_runtime_context().get_node_id()
        others = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != this]
        if not others:
            raise SystemExit("error: the cluster has no node besides this one")
        server = make_server(f"ray-actors-{os.getpid()}")
        service = shmreplay.ray.BufferService(server)
        remote_actor = ray.remote(num_cpus=0, max_concurrency=3)(CartPoleActor)
        actors = [remote_actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            others[i % len(others)], soft=False)).remote(service.client(), args.seed + i)
            for i in range(args.actors)]
        where = ray.get([actor.node.remote() for actor in actors], timeout=120)
        print(f"buffer '{server.name}' on node {this[:8]}; actors on nodes "
              f"{sorted({n[:8] for n in where})}", flush=True)
        learner_process = spawn.Process(target=learner, args=(server.name, args.seed, stop,
                                                              stats), name="learner")
        learner_process.start()
        runs = [actor.run.remote() for actor in actors]
        returns, learner_steps = collections.deque(maxlen=WINDOW), 0
        start = time.monotonic()
        while time.monotonic() - start < args.seconds:
            time.sleep(1.0)
            steps = 0
            for new, actor_steps in ray.get([a.progress.remote() for a in actors]):
                returns.extend(new)
                steps += actor_steps
            while True:
                try:
                    kind, value = stats.get_nowait()
                except queue.Empty:
                    break
                if kind == "learner":
                    learner_steps = value
            average = float(np.mean(returns)) if returns else 0.0
            print(f"{time.monotonic() - start:5.0f} s  env steps {steps:8,d}  learner "
                  f"steps {learner_steps:6,d}  average return {average:6.1f}", flush=True)
            if len(returns) == WINDOW and average >= args.target:
                print(f"solved: average return {average:.1f} over {WINDOW} episodes")
                code = 0
                break
        else:
            print(f"error: not solved in {args.seconds:g} s", file=sys.stderr)
    finally:
        for actor in actors:
            actor.stop.remote()
        if runs:
            ray.wait(runs, num_returns=len(runs), timeout=30)
        stop.set()
        if learner_process is not None:
            learner_process.join(30)
            if learner_process.is_alive():
                learner_process.kill()
        for actor in actors:
            ray.kill(actor)
        if service is not None:
            service.stop()
        if server is not None:
            server.stop()
        ray.shutdown()
        if nodes is not None:
            nodes.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
