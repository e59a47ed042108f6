"""shmreplay.ray on a real multi-node Ray cluster on this machine: the buffer's owner
(the learner) is this test process on the head node; remote actors on another node
write through ``RemoteClient`` only; the buffer-side actors run on the head node."""

import os
import time
import types

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install "
                                        "'shmreplay[ray]')")

import shmreplay  # noqa: E402
from shmreplay import errors, rate_limiters, selectors  # noqa: E402
from shmreplay.replay_sample import ReplaySample, TableInfo  # noqa: E402

shmray = pytest.importorskip("shmreplay.ray")
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
MB = 2 ** 20


@pytest.fixture(scope="module")
def cluster():
    """A head node (the buffer's) and one worker node, 1 CPU each; always shut down."""
    from ray.cluster_utils import Cluster
    nodes = Cluster(initialize_head=True,
                    head_node_args={"num_cpus": 1, "object_store_memory": 100 * MB})
    try:
        nodes.add_node(num_cpus=1, object_store_memory=100 * MB)
        # The workers import this module (its actor class) from the tests' folder.
        path = os.pathsep.join(filter(None, [os.path.dirname(__file__),
                                             os.environ.get("PYTHONPATH")]))
        ray.init(address=nodes.address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
        nodes.wait_for_nodes(timeout=60)
        here = ray.get_runtime_context().get_node_id()
        others = [node["NodeID"] for node in ray.nodes()
                  if node["Alive"] and node["NodeID"] != here]
        assert len(others) == 1, ray.nodes()
        yield types.SimpleNamespace(buffer_node=here, remote_node=others[0])
    finally:
        ray.shutdown()
        nodes.shutdown()


@ray.remote(num_cpus=0)
class Sender:
    """An actor on the remote node: it writes through the RemoteClient only."""

    def __init__(self, remote):
        self.remote = remote

    def node(self):
        return ray.get_runtime_context().get_node_id()

    def insert(self, data, priorities, timeout=None):
        return self.remote.insert(data, priorities, timeout)

    def insert_batch(self, data, priorities, timeout=None):
        return self.remote.insert_batch(data, priorities, timeout)

    def episodes(self, table, first, count, steps, chunk_items):
        """``count`` episodes of ``steps`` steps; an item per step from step 2 on: the
        last 3 steps' ``x`` (x = episode * 1000 + step) and the last step's ``i``."""
        writer = self.remote.trajectory_writer(3, chunk_items=chunk_items)
        for episode in range(first, first + count):
            for step in range(steps):
                value = episode * 1000 + step
                writer.append({"x": np.full(2, value, np.float32), "i": np.int64(value)})
                if step >= 2:
                    writer.create_item(table, 1.0, {"x": writer.history["x"][-3:],
                                                    "i": writer.history["i"][-1]})
            writer.end_episode()
        writer.close()
        return count * (steps - 2)

    def legacy(self, table, steps):
        with self.remote.writer(2, chunk_items=4) as writer:
            for step in range(steps):
                writer.append({"v": np.float64(step)})
                if step >= 1:
                    writer.create_item(table, 2, 1.0)
        return steps - 1

    def partial(self, table, steps):
        with self.remote.trajectory_writer(3, chunk_items=2) as writer:
            made = _acme_steps(writer, table, 0, steps)
            writer.end_episode()
        return made

    def sample(self, table, batch_size):
        return self.remote.sample_batch(table, batch_size, timeout=10)

    def info(self):
        return self.remote.server_info(timeout=10)

    def run(self, method, *args):
        """Any RemoteClient call, its error returned as a value."""
        try:
            return getattr(self.remote, method)(*args)
        except Exception as error:  # noqa: BLE001 - the test looks at it
            return error


def _sender(cluster, remote):
    sender = Sender.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        cluster.remote_node, soft=False)).remote(remote)
    assert ray.get(sender.node.remote(), timeout=60) == cluster.remote_node
    return sender


class Setup:
    """A buffer owned by this process, its BufferService and a RemoteClient."""

    def __init__(self, name, tables, **service_args):
        self.server = shmreplay.Server(tables, name=name)
        self.client = shmreplay.Client(self.server.name)
        try:
            self.service = shmray.BufferService(self.server, **service_args)
        except BaseException:
            self.close()
            raise
        self.remote = self.service.client()

    def close(self):
        service = getattr(self, "service", None)
        if service is not None:
            service.stop()
        self.client.close()
        self.server.stop()
        assert not os.path.exists(_ledger(self.server.name)), "the ledger was left behind"


def _ledger(name):
    return f"/dev/shm/shmreplay-ray-ledger.{name}"


@pytest.fixture
def setup(cluster, buffer_name):
    made = []

    def make(tables, **service_args):
        made.append(Setup(buffer_name, tables, **service_args))
        return made[-1]
    yield make
    for one in made:
        one.close()


def _drain(client, table):
    """Every item of a queue, oldest first, as one batch."""
    size = client.server_info()[table].current_size
    return client.sample_batch(table, size, timeout=10) if size else None


def test_remote_actors_write_items_intact(cluster, setup):
    s = setup([shmreplay.Table.queue("q", 1000), shmreplay.Table.queue("traj", 1000),
               shmreplay.Table.queue("legacy", 100),
               shmreplay.Table("prio", selectors.Prioritized(1.0), selectors.Fifo(), 100,
                               rate_limiters.MinSize(1))])
    sender = _sender(cluster, s.remote)
    keys = [ray.get(sender.insert.remote({"x": np.full(3, i, np.float32)}, {"q": 1.0}),
                    timeout=60)["q"] for i in range(5)]
    batch = ray.get(sender.insert_batch.remote(
        {"x": np.arange(5, 13, dtype=np.float32)[:, None].repeat(3, 1)}, {"q": 1.0}),
        timeout=60)["q"]
    assert batch.shape == (8,) and batch.dtype == np.uint64 and len(set(keys)) == 5
    q = _drain(s.client, "q")
    np.testing.assert_array_equal(q.data["x"], np.arange(13, dtype=np.float32)[:, None]
                                  .repeat(3, 1))
    assert q.info.key.tolist() == keys + batch.tolist()

    made = ray.get(sender.episodes.remote("traj", 0, 3, 7, 4), timeout=60)
    traj = _drain(s.client, "traj")
    assert made == 15 and len(traj.info.key) == 15
    for x, i in zip(traj.data["x"], traj.data["i"]):
        assert x[:, 0].tolist() == [i - 2, i - 1, i] and x.shape == (3, 2)  # one episode
    assert sorted(traj.data["i"] % 1000) == sorted(list(range(2, 7)) * 3)

    assert ray.get(sender.legacy.remote("legacy", 6), timeout=60) == 5
    legacy = _drain(s.client, "legacy")
    assert legacy.data["v"].tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]

    # Priorities and samples from the remote node; results are the local types.
    s.client.insert({"y": np.float32(1)}, {"prio": 1.0})
    sample = ray.get(sender.sample.remote("prio", 2), timeout=60)
    assert isinstance(sample, ReplaySample) and sample.info.key.shape == (2,)
    key = int(sample.info.key[0])
    assert ray.get(sender.run.remote("update_priorities", "prio", np.array([key], np.uint64),
                                     np.array([5.0]))) == 1
    assert s.client.sample_batch("prio", 1, timeout=5).info.priority[0] == 5.0
    ray.get(sender.run.remote("mutate_priorities", "prio", {}, [key]))
    info = ray.get(sender.info.remote(), timeout=60)
    assert isinstance(info["prio"], TableInfo) and info["prio"].current_size == 0
    assert info["q"].num_inserted == 13


def test_back_pressure_times_out_and_chunks_go_once(cluster, setup):
    s = setup([shmreplay.Table.queue("q", 2)])
    sender = _sender(cluster, s.remote)
    for i in range(2):
        ray.get(sender.insert.remote({"x": np.float32(i)}, {"q": 1.0}, 5), timeout=60)
    start = time.monotonic()
    error = ray.get(sender.run.remote("insert", {"x": np.float32(2)}, {"q": 1.0}, 0.5),
                    timeout=60)
    assert isinstance(error, errors.DeadlineExceededError), error
    assert 0.45 <= time.monotonic() - start < 10
    assert s.client.server_info()["q"].current_size == 2           # nothing inserted
    # A writer's chunk that the rate limiter holds up: flush raises, and the next flush,
    # once there is room, inserts its items once (the chunk is resent, not re-applied).
    writer = s.remote.trajectory_writer(1, chunk_items=100)
    for value in (10, 11):
        writer.append({"x": np.float32(value)})
        writer.create_item("q", 1.0, {"x": writer.history["x"][-1]})
    with pytest.raises(errors.DeadlineExceededError):
        writer.flush(timeout_ms=300)
    assert s.client.sample_batch("q", 2, timeout=5).data["x"].tolist() == [0, 1]
    writer.flush(timeout_ms=5000)
    assert s.client.server_info()["q"].current_size == 2
    assert s.client.sample_batch("q", 2, timeout=5).data["x"].tolist() == [10, 11]
    writer.close()
    assert s.client.server_info()["q"].num_inserted == 4
    # A full chunk is in flight while the next is built: its error comes at the next send.
    writer = s.remote.trajectory_writer(1, chunk_items=1)
    writer.append({"x": np.float32(0)})
    writer.create_item("no-such-table", 1.0, {"x": writer.history["x"][-1]})
    with pytest.raises(errors.TableNotFoundError):
        writer.flush()
    writer.close()


def test_sender_killed_mid_send_leaves_no_partial_item(cluster, setup):
    chunk = 25
    s = setup([shmreplay.Table.queue("traj", 100_000)])
    sender = _sender(cluster, s.remote)
    running = sender.episodes.remote("traj", 0, 1, 10_000_000, chunk)   # one long episode
    deadline = time.monotonic() + 60
    while s.client.server_info()["traj"].current_size < 3 * chunk:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    ray.kill(sender, no_restart=True)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(running, timeout=60)
    # A chunk that arrived is applied whole by the buffer's side: wait until it is done
    # (the size holds still for half a second).
    size, deadline = -1, time.monotonic() + 30
    while time.monotonic() < deadline:
        before = s.client.server_info()["traj"].current_size
        time.sleep(0.5)
        size = s.client.server_info()["traj"].current_size
        if size == before:
            break
    assert size % chunk == 0, f"{size} items: a chunk was cut"
    traj = _drain(s.client, "traj")
    for x, i in zip(traj.data["x"], traj.data["i"]):
        assert x[:, 0].tolist() == [i - 2, i - 1, i]


def test_a_retried_send_is_applied_once(cluster, setup):
    s = setup([shmreplay.Table.queue("q", 100)])
    actor = s.service.actors[0]
    data = {"x": np.float32(7)}
    first = s.remote._call(actor, "insert", "a1b2", 1, data, {"q": 1.0}, 5)
    again = s.remote._call(actor, "insert", "a1b2", 1, data, {"q": 1.0}, 5)   # a retry
    assert first == again and s.client.server_info()["q"].current_size == 1
    ops = [("a", data), ("i", "q", 1.0, {"x": shmray.RemoteColumn(("x",), [0], True)})]
    for _ in range(2):
        s.remote._call(actor, "apply_chunk", "c3d4", 1, "trajectory",
                       {"num_keep_alive_refs": 1}, 0, None, ops, True, 5)
    assert s.client.server_info()["q"].current_size == 2
    # The reply is lost: the actor dies right after applying; Ray restarts it and the
    # client retries the same (writer id, seq); the restarted actor finds it applied.
    ray.get(actor._test_die_after_next_apply.remote(), timeout=30)
    keys = s.remote.insert({"x": np.float32(8)}, {"q": 1.0}, timeout=5)
    assert s.client.server_info()["q"].current_size == 3
    batch = s.client.sample_batch("q", 3, timeout=5)
    assert batch.data["x"].tolist() == [7, 7, 8]
    assert int(batch.info.key[2]) == keys["q"]


def test_buffer_side_actor_restarts_and_reattaches(cluster, setup):
    s = setup([shmreplay.Table.queue("q", 1000), shmreplay.Table.queue("traj", 1000)])
    sender = _sender(cluster, s.remote)
    for i in range(3):
        s.client.insert({"x": np.float32(i)}, {"q": 1.0})          # the learner's own
    writer = s.remote.trajectory_writer(3, chunk_items=1)
    for step in range(4):
        writer.append({"i": np.int64(step)})
    writer.create_item("traj", 1.0, {"i": writer.history["i"][-3:]})   # shipped: 1 item
    old_pid, _ = ray.get(s.service.actors[0].ping.remote(), timeout=30)
    ray.kill(s.service.actors[0], no_restart=False)
    ray.get(sender.insert.remote({"x": np.float32(3)}, {"q": 1.0}, 5), timeout=120)
    new_pid, node = ray.get(s.service.actors[0].ping.remote(), timeout=30)
    assert new_pid != old_pid and node == cluster.buffer_node
    # The writer goes on across the restart: the new actor gets the kept steps.
    writer.append({"i": np.int64(4)})
    writer.create_item("traj", 1.0, {"i": writer.history["i"][-3:]})
    writer.end_episode()
    writer.close()
    q = s.client.sample_batch("q", 4, timeout=5)
    assert q.data["x"].tolist() == [0, 1, 2, 3]                    # buffer unaffected
    traj = s.client.sample_batch("traj", 2, timeout=5)
    assert traj.data["i"].tolist() == [[1, 2, 3], [2, 3, 4]]


def _acme_steps(writer, table, first, steps, between=None):
    """Acme's adders' pattern: each step opens with its observation (``partial_step``)
    and is completed by its action and reward; a transition item is cut while the next
    step is open, over the open step's observation. ``between(t)`` runs after step t
    opened. Returns the items made."""
    for t in range(first, first + steps):
        writer.append({"obs": np.full(2, t, np.float32)}, partial_step=True)
        if t > first:
            history = writer.history
            writer.create_item(table, 1.0, {
                "obs": history["obs"][-2], "action": history["action"][-2],
                "reward": history["reward"][-2], "next_obs": history["obs"][-1]})
        if between is not None:
            between(t)
        writer.append({"action": np.int64(t), "reward": np.float32(t / 2)})
    return steps - 1


def test_partial_steps_work_remotely_as_locally(cluster, setup):
    s = setup([shmreplay.Table.queue("local", 1000), shmreplay.Table.queue("remote", 1000)])
    with s.client.trajectory_writer(3) as writer:
        made = _acme_steps(writer, "local", 0, 9)
        writer.end_episode()
    local = _drain(s.client, "local")
    assert made == 8 and local.data["next_obs"][:, 0].tolist() == list(range(1, 9))

    def restart(t):   # the buffer-side actor dies while a step is open
        if t == 4:
            ray.kill(s.service.actors[0], no_restart=False)

    writer = s.remote.trajectory_writer(3, chunk_items=1)   # chunks cut in open steps
    assert _acme_steps(writer, "remote", 0, 9, between=restart) == made
    assert sorted(writer.history) == ["action", "obs", "reward"]   # every field seen
    writer.append({"obs": np.zeros(2, np.float32)}, partial_step=True)
    with pytest.raises(ValueError, match="already been set"):
        writer.append({"obs": np.zeros(2, np.float32), "action": np.int64(0)})
    writer.end_episode()
    writer.close()
    remote = _drain(s.client, "remote")
    assert remote.data.keys() == local.data.keys()
    for key in local.data:
        np.testing.assert_array_equal(remote.data[key], local.data[key], err_msg=key)
    # The same through the remote node's Sender (a plain remote process).
    assert ray.get(_sender(cluster, s.remote).partial.remote("remote", 9), timeout=60) == 8
    again = _drain(s.client, "remote")
    for key in local.data:
        np.testing.assert_array_equal(again.data[key], local.data[key], err_msg=key)


def test_a_clear_error_while_the_buffer_is_gone(cluster, setup, buffer_name):
    s = setup([shmreplay.Table.queue("q", 10)])
    sender = _sender(cluster, s.remote)
    ray.get(sender.insert.remote({"x": np.float32(1)}, {"q": 1.0}, 5), timeout=60)
    s.server.stop()
    error = ray.get(sender.run.remote("insert", {"x": np.float32(2)}, {"q": 1.0}, 1),
                    timeout=60)
    assert isinstance(error, errors.BufferBrokenError), error
    s.service.stop()
    with shmray.BufferService(buffer_name + "-none") as nowhere:
        error = ray.get(_sender(cluster, nowhere.client()).run.remote(
            "insert", {"x": np.float32(2)}, {"q": 1.0}, 0.3), timeout=60)
    assert isinstance(error, errors.BufferNotReadyError), error
    assert buffer_name + "-none" in str(error)
    assert not os.path.exists(_ledger(buffer_name + "-none"))


def test_the_docs_page_runs(cluster):
    """Every ```python block of docs/beyond-one-machine.md, in order, on this cluster."""
    import re
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs",
                        "beyond-one-machine.md")
    with open(path) as file:
        blocks = re.findall(r"```python\n(.*?)```", file.read(), re.S)
    assert blocks
    namespace = {"__name__": "beyond_one_machine_docs"}
    for block in blocks:
        exec(compile(block, path, "exec"), namespace)
    assert not os.path.exists(_ledger("ray-docs"))
