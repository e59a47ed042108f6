"""``PatternDataset``: StructuredWriter configs applied to a ``tf.data`` dataset of steps,
with no buffer involved (Reverb's ``reverb.PatternDataset``), re-exported by
``shmreplay.tf``.

The dataset yields the trajectories a ``StructuredWriter`` with the same configs would
insert for the same steps, in the order it would insert them. The patterns are applied
by ``patterns.Patterns``, the writer's own logic, over the steps' arrays.
"""

import numpy as np
import optree
import tensorflow as tf

from shmreplay._writers import pattern_config as _pattern_config
from shmreplay._writers.patterns import Patterns
from shmreplay.replay_sample import ReplaySample, SampleInfo
from shmreplay.structured_writer import infer_signature


class PatternDataset(tf.data.Dataset):
    """A dataset of the trajectories ``configs`` make from ``input_dataset``'s steps.

    Runs eagerly (as Reverb's does): build and iterate it in TensorFlow 2's eager mode.
    Each iteration starts from the input's first step with fresh state.

    Args:
      input_dataset: A dataset of steps (flatten a dataset of episodes first).
      configs: ``structured_writer.Config`` s, all of one pattern structure (they make
        one dataset's elements; their ``table`` is not used). Leaves may differ in
        length between configs: the element spec then has length None there.
      respect_episode_boundaries: If True, no trajectory spans two episodes.
      is_end_of_episode: A function of a step returning a scalar bool: True on the last
        step of an episode.

    Raises:
      ValueError: invalid configs (see ``infer_signature`` and ``Client.structured_writer``),
        or ``is_end_of_episode`` does not return a scalar bool.
    """

    def __init__(self, input_dataset: tf.data.Dataset, configs, respect_episode_boundaries: bool,
                 is_end_of_episode):
        # (unnamed, as Reverb's element_spec is)
        signature = optree.tree_map(lambda spec: tf.TensorSpec(spec.shape, spec.dtype),
                                    infer_signature(configs, input_dataset.element_spec))
        prepared = _pattern_config.prepared(configs)
        is_end = _end_of_episode_function(is_end_of_episode, input_dataset.element_spec)
        structure = optree.tree_structure(_pattern_config.unpack(prepared[0]), none_is_leaf=True)
        clear = bool(respect_episode_boundaries)

        def trajectories():
            patterns = Patterns(prepared, _as_array)
            for step in input_dataset:
                leaves = optree.tree_leaves(step, none_is_leaf=True)
                values = {i: leaves[i].numpy() for i in patterns.used}
                patterns.check_values(values, lambda i: f"column {i} of the step")
                yield from _items(patterns.append(values, finalize=True), structure)
                if bool(is_end(step)):
                    yield from _items(patterns.end_episode(clear_buffers=clear), structure)

        self._input_dataset = input_dataset
        self._signature = signature
        self._dataset = tf.data.Dataset.from_generator(trajectories, output_signature=signature)
        super().__init__(self._dataset._variant_tensor)

    @property
    def element_spec(self):
        """The spec of one element: the trajectory the configs' patterns make."""
        return self._signature

    def _inputs(self):
        return []  # (the generator reads the input; tf.data sees a source)


def pattern_dataset_with_info(input_dataset: tf.data.Dataset, configs,
                              respect_episode_boundaries: bool, is_end_of_episode):
    """A ``PatternDataset`` whose elements are ``ReplaySample(info, data)``, ``info`` all
    zeros (with Reverb's info dtypes), as if the trajectories had been sampled."""
    dataset = PatternDataset(input_dataset, configs, respect_episode_boundaries,
                             is_end_of_episode)
    dtypes = SampleInfo.dtypes()
    zeros = SampleInfo(*(tf.constant(0, tf.as_dtype(dtype)) for dtype in dtypes))
    return dataset.map(lambda data: ReplaySample(info=zeros, data=data))


def _as_array(value):
    return value


def _items(made, structure):
    for _, leaves, _ in made:
        yield optree.tree_unflatten(structure, [
            cells[0] if squeeze else np.stack(cells) for cells, squeeze in leaves])


def _end_of_episode_function(is_end_of_episode, element_spec):
    """``is_end_of_episode`` traced once for the steps' spec; checks it gives one bool."""
    if not callable(is_end_of_episode):
        raise TypeError(f"is_end_of_episode must be a function of a step, got "
                        f"{type(is_end_of_episode).__name__}.")
    function = tf.function(lambda step: tf.convert_to_tensor(is_end_of_episode(step)))
    concrete = function.get_concrete_function(element_spec)
    output = concrete.structured_outputs
    if (not isinstance(output, tf.Tensor) or output.dtype != tf.bool
            or not output.shape.is_compatible_with([])):
        got = (tf.TensorSpec(output.shape, output.dtype) if isinstance(output, tf.Tensor)
               else output)
        raise ValueError(f"Invalid `is_end_of_episode`. `is_end_of_episode` must return "
                         f"`bool`, but its return type is {got}.")
    return concrete
