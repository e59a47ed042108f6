"""The cases of item_exact.py: for each, the tables a learner would make and the actor
code that fills them, written against whichever ``reverb`` is importable (DeepMind's, or
shmreplay's shim). Acme's and TF-Agents' code runs as it is; only the environments and
the policy are fakes, deterministic so that two runs write the same items.

A case is ``Case(tables, act, read_dataset, note, uses_acme)``: ``tables(reverb)``
returns the tables, ``act(reverb, client, actor_id)`` runs one actor, ``read_dataset``
(TF-Agents only) reads batches the way a learner would; an actor of a case that
``uses_acme`` calls ``acme_adders()`` before it connects (see there).
"""

import importlib.util
import os
import sys
from typing import Callable, NamedTuple, Optional

import numpy as np

# Episode lengths (steps) of each actor's fake environment: short, long and one-step
# episodes, so that sequences are cut at every phase of their period.
LENGTHS = {0: [3, 7, 1, 12], 1: [5, 2, 9]}
MAX_EPISODE_STEPS = 16  # EpisodeAdder's max_sequence_length, the episode observer's too
TABLE = "priority_table"  # Acme's DEFAULT_PRIORITY_TABLE
ACME_SOURCE = os.environ.get("ITEM_EXACT_ACME_GIT", "/work/.mirror/google-deepmind+acme/repo")


class Case(NamedTuple):
    tables: Callable
    act: Callable
    read_dataset: Optional[Callable] = None
    note: str = ""
    uses_acme: bool = False


def _observation(actor_id, episode, t):
    return np.array([actor_id * 1000 + episode * 100 + t, t * 0.5], np.float32)


def _action(actor_id, episode, t):
    return np.int32((actor_id + episode + t) % 4)


def _reward(actor_id, t):
    return np.float32(t * 0.25 + actor_id)


# --- Acme -------------------------------------------------------------------------------

def _acme_env_spec():
    from acme import specs
    return specs.EnvironmentSpec(
        observations=specs.Array((2,), np.float32, name="observation"),
        actions=specs.BoundedArray((), np.int32, 0, 3, name="action"),
        rewards=specs.Array((), np.float32, name="reward"),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount"))


def _run_acme_episodes(adder, actor_id):
    """add_first/add as an Acme EnvironmentLoop does; even episodes end by termination
    (discount 0), odd ones by truncation (discount 1)."""
    import dm_env
    for episode, length in enumerate(LENGTHS[actor_id]):
        adder.add_first(dm_env.restart(_observation(actor_id, episode, 0)))
        for t in range(1, length + 1):
            last = t == length
            kind = dm_env.StepType.LAST if last else dm_env.StepType.MID
            discount = np.float32(0.0 if last and episode % 2 == 0 else 1.0)
            timestep = dm_env.TimeStep(kind, _reward(actor_id, t), discount,
                                       _observation(actor_id, episode, t))
            adder.add(_action(actor_id, episode, t - 1), timestep)
    # As Acme's adder tests do: the destructor flushes the pending items.
    getattr(adder, "__del__", lambda: None)()


def _signature(signature):
    """The table's signature, or None for a diagnostic run (``--without-signatures``:
    do the items themselves go in and come out right, whatever the signature check)."""
    return None if os.environ.get("ITEM_EXACT_WITHOUT_SIGNATURES") == "1" else signature


def _queue(reverb, signature):
    return [reverb.Table.queue(TABLE, 1000, signature=_signature(signature))]


def _acme_case(make_adder, signature, note=""):
    def tables(reverb):
        return _queue(reverb, signature())

    def act(reverb, client, actor_id):
        _run_acme_episodes(make_adder(client), actor_id)
    return Case(tables, act, note=note, uses_acme=True)


def _episode(padding):
    adders = acme_adders()
    padding_fn = (lambda shape, dtype: np.zeros(shape, dtype)) if padding else None
    return _acme_case(
        lambda client: adders.EpisodeAdder(client, MAX_EPISODE_STEPS, padding_fn=padding_fn),
        lambda: adders.EpisodeAdder.signature(_acme_env_spec(), sequence_length=None),
        f"EpisodeAdder(max_sequence_length={MAX_EPISODE_STEPS}"
        f"{', padding_fn=zeros' if padding else ''}), signature(sequence_length=None)")


def _sequence(behavior, signature_length, **kwargs):
    adders = acme_adders()
    end = getattr(adders.EndBehavior, behavior)
    return _acme_case(
        lambda client: adders.SequenceAdder(client, sequence_length=4, period=2,
                                            end_of_episode_behavior=end, **kwargs),
        lambda: adders.SequenceAdder.signature(_acme_env_spec(),
                                               sequence_length=signature_length),
        f"SequenceAdder(sequence_length=4, period=2, {behavior}"
        f"{''.join(f', {k}={v}' for k, v in kwargs.items())}), "
        f"signature(sequence_length={signature_length})")


def _n_step(n):
    adders = acme_adders()
    return _acme_case(
        lambda client: adders.NStepTransitionAdder(client, n_step=n, discount=0.9),
        lambda: adders.NStepTransitionAdder.signature(_acme_env_spec()),
        f"NStepTransitionAdder(n_step={n}, discount=0.9), its signature")


ADDER_FILES = ("__init__", "base", "episode", "sequence", "structured", "transition", "utils")


def acme_adders():
    """``acme.adders.reverb``: the installed package's (``ITEM_EXACT_ACME_ADDERS=package``)
    or, by default, Acme's CURRENT source of that package (``head``: read from Acme's git
    repository, ahead of the installed one on ``acme.adders.__path__``). acme 0.4.0's
    adders pass ``get_signature_timeout_ms`` to ``Client.trajectory_writer``, which
    dm-reverb 0.14.0 no longer takes (Reverb 0.10 replaced it; acme 0.4.0 pins
    dm-reverb 0.7.0, which has no wheel for Python 3.11); Acme's current adders pass
    ``validate_items`` and import against acme 0.4.0's other modules unchanged.

    Call it before anything imports ``acme.adders.reverb``: a spawned actor calls it
    before it connects its Client, because on shmreplay connecting unpickles the
    tables' signatures, whose namedtuples (Acme's ``Step``) are pickled by reference to
    ``acme.adders.reverb.base``, and importing that would load the installed package.
    Raises if the installed package was loaded first."""
    import acme.adders
    if os.environ.get("ITEM_EXACT_ACME_ADDERS", "head") == "head":
        _install_head_adders(acme.adders)
    from acme.adders import reverb as adders
    return adders


def _install_head_adders(package):
    import subprocess
    root = os.path.join(os.environ.get("ITEM_EXACT_WORK", "/tmp"), "acme_head", "adders")
    folder = os.path.join(root, "reverb")
    if not os.path.exists(os.path.join(folder, "__init__.py")):
        os.makedirs(folder, exist_ok=True)
        for name in ADDER_FILES:  # __init__ last: a half-written copy is never imported
            text = subprocess.run(["git", "-C", ACME_SOURCE, "show",
                                   f"HEAD:acme/adders/reverb/{name}.py"],
                                  capture_output=True, check=True).stdout
            with open(os.path.join(folder, f"{name}.py.tmp"), "wb") as f:
                f.write(text)
        for name in ADDER_FILES[1:] + ADDER_FILES[:1]:
            os.replace(os.path.join(folder, f"{name}.py.tmp"), os.path.join(folder, f"{name}.py"))
    loaded = sys.modules.get("acme.adders.reverb")
    if loaded is not None and os.path.dirname(loaded.__file__) != folder:
        raise RuntimeError(
            f"acme.adders.reverb was imported from {loaded.__file__} before Acme HEAD's "
            f"adders were put on acme.adders.__path__ (call acme_adders() earlier)")
    if root not in package.__path__:
        package.__path__.insert(0, root)


def adder_modules():
    """``{module name: file}`` of the Acme adder code this process has imported, to
    check that a case's actors ran the same adders as its parent."""
    return {name: getattr(module, "__file__", None) for name, module in sys.modules.items()
            if name == "acme_structured" or name.startswith("acme.adders.reverb")}


def acme_structured_module():
    """Acme's CURRENT ``acme/adders/reverb/structured.py`` (not in the 0.4.0 package)."""
    if os.environ.get("ITEM_EXACT_ACME_ADDERS", "head") == "head":
        acme_adders()
        from acme.adders.reverb import structured
        return structured
    import subprocess
    path = os.path.join(os.environ.get("ITEM_EXACT_WORK", "/tmp"), "acme_structured.py")
    if not os.path.exists(path):
        text = subprocess.run(["git", "-C", ACME_SOURCE, "show",
                               "HEAD:acme/adders/reverb/structured.py"],
                              capture_output=True, check=True).stdout
        with open(path, "wb") as f:
            f.write(text)
    spec = importlib.util.spec_from_file_location("acme_structured", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _structured(kind):
    def configs_and_spec():
        structured = acme_structured_module()
        step_spec = structured.create_step_spec(_acme_env_spec())
        if kind == "sequence":  # R2D2's builder (Acme HEAD): TRUNCATE, default pattern
            configs = structured.create_sequence_config(
                step_spec, sequence_length=4, period=2,
                end_of_episode_behavior=structured.EndBehavior.TRUNCATE)
        else:  # D4PG's builder (Acme HEAD)
            configs = structured.create_n_step_transition_config(step_spec, n_step=3)
        return structured, configs, step_spec

    def tables(reverb):
        from reverb import structured_writer as sw
        _, configs, step_spec = configs_and_spec()
        return _queue(reverb, sw.infer_signature(configs, step_spec))

    def act(reverb, client, actor_id):
        structured, configs, step_spec = configs_and_spec()
        adder = structured.StructuredAdder(client, max_in_flight_items=5, configs=configs,
                                           step_spec=step_spec)
        _run_acme_episodes(adder, actor_id)
    what = ("create_sequence_config(4, period=2, TRUNCATE)" if kind == "sequence"
            else "create_n_step_transition_config(n_step=3)")
    return Case(tables, act, note=f"StructuredAdder (Acme HEAD) with {what}, "
                                  "signature sw.infer_signature(configs, step_spec)",
                uses_acme=True)


# --- TF-Agents --------------------------------------------------------------------------

def _tf_agents_parts(actor_id=0):
    """A fake PyEnvironment with LENGTHS[actor_id] episodes and a scripted policy."""
    from tf_agents.environments import py_environment
    from tf_agents.policies import py_policy
    from tf_agents.specs import array_spec
    from tf_agents.trajectories import policy_step, time_step as ts

    class FakeEnv(py_environment.PyEnvironment):
        def __init__(self):
            super().__init__(handle_auto_reset=True)  # PyDriver relies on it
            self._episode, self._t = -1, 0

        def observation_spec(self):
            return array_spec.ArraySpec((2,), np.float32, "observation")

        def action_spec(self):
            return array_spec.BoundedArraySpec((), np.int32, 0, 3, "action")

        def reward_spec(self):
            return array_spec.ArraySpec((), np.float32, "reward")

        def _reset(self):
            self._episode, self._t = self._episode + 1, 0
            return ts.restart(_observation(actor_id, self._episode, 0),
                              reward_spec=self.reward_spec())

        def _step(self, action):
            lengths = LENGTHS[actor_id]
            self._t += 1
            observation = _observation(actor_id, self._episode, self._t)
            reward = _reward(actor_id, self._t)
            if self._t >= lengths[self._episode % len(lengths)]:
                return ts.termination(observation, reward)
            return ts.transition(observation, reward, discount=np.float32(1.0))

    class ScriptedPolicy(py_policy.PyPolicy):
        def __init__(self, env):
            super().__init__(env.time_step_spec(), env.action_spec())
            self._step = 0

        def _action(self, time_step, policy_state):
            self._step += 1
            return policy_step.PolicyStep(np.int32(self._step % 4), (), ())

    env = FakeEnv()
    return env, ScriptedPolicy(env)


def _collect_data_spec():
    from tf_agents.specs import tensor_spec
    _, policy = _tf_agents_parts()
    return tensor_spec.from_spec(policy.trajectory_spec)


def _tf_agents_case(observer_kind, batch_size=4, num_batches=3):
    def tables(reverb):
        from tf_agents.specs import tensor_spec
        # The DQN tutorial's table: the collect spec with a None outer dimension.
        signature = tensor_spec.add_outer_dim(_collect_data_spec())
        return [reverb.Table(TABLE, max_size=1000, sampler=reverb.selectors.Uniform(),
                             remover=reverb.selectors.Fifo(),
                             rate_limiter=reverb.rate_limiters.MinSize(1),
                             signature=_signature(signature))]

    def act(reverb, client, actor_id):
        from tf_agents.drivers import py_driver
        from tf_agents.replay_buffers import reverb_utils
        env, policy = _tf_agents_parts(actor_id)
        if observer_kind == "episode":
            observer = reverb_utils.ReverbAddEpisodeObserver(
                client, TABLE, max_sequence_length=MAX_EPISODE_STEPS, priority=1.0)
        else:
            observer = reverb_utils.ReverbAddTrajectoryObserver(client, TABLE,
                                                                sequence_length=2)
        driver = py_driver.PyDriver(env, policy, [observer],
                                    max_episodes=len(LENGTHS[actor_id]))
        driver.run(env.reset())
        observer.close()

    def read_dataset(reverb, address):
        from tf_agents.replay_buffers import reverb_replay_buffer
        replay = reverb_replay_buffer.ReverbReplayBuffer(
            _collect_data_spec(), TABLE, sequence_length=2 if observer_kind != "episode"
            else None, server_address=address)
        dataset = replay.as_dataset(sample_batch_size=batch_size, num_steps=2)
        return [batch for batch, _ in dataset.take(num_batches)]
    name = ("ReverbAddEpisodeObserver(max_sequence_length=16)" if observer_kind == "episode"
            else "ReverbAddTrajectoryObserver(sequence_length=2)")
    return Case(tables, act, read_dataset,
                f"{name}, DQN tutorial table (add_outer_dim signature, Uniform, max_size "
                f"1000), PyDriver; then ReverbReplayBuffer.as_dataset(sample_batch_size="
                f"{batch_size}, num_steps=2), {num_batches} batches")


CASES = {
    "acme_episode": lambda: _episode(padding=False),
    "acme_episode_padded": lambda: _episode(padding=True),
    "acme_sequence_write": lambda: _sequence("WRITE", None),
    "acme_sequence_continue": lambda: _sequence("CONTINUE", None),
    "acme_sequence_zero_pad": lambda: _sequence("ZERO_PAD", None, delta_encoded=True),
    "acme_sequence_zero_pad_fixed": lambda: _sequence("ZERO_PAD", 4),
    "acme_sequence_truncate": lambda: _sequence("TRUNCATE", None),
    "acme_nstep1": lambda: _n_step(1),
    "acme_nstep3": lambda: _n_step(3),
    "acme_structured_sequence": lambda: _structured("sequence"),
    "acme_structured_nstep3": lambda: _structured("nstep"),
    "tfa_episode_observer": lambda: _tf_agents_case("episode"),
    "tfa_trajectory_observer": lambda: _tf_agents_case("trajectory"),
}
