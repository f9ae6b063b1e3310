"""Inverted dropout drawing 16 random bits per element instead of a float.

keras.layers.Dropout draws one uniform float per element (a 32-bit Philox output, converted);
the random numbers are a noticeable part of a CPU training step (CHANGELOG.md, "Measured gains
of the speed-ups"). Here each 32-bit draw serves two elements: an element is dropped when its 16
bits fall below round(rate · 2^16), so the drop probability is that threshold / 2^16 (0.100006
for 0.1) and the kept elements are scaled by the exact inverse of the keep probability.
"""
import keras
import tensorflow as tf

from tfnmt import fast_ops

_LEVELS = 2 ** 16


def dropout_keep_mask(shape, rate, seed):
    """A stateless keep mask (the same seed gives the same mask).

    Args:
      shape: the mask's shape.
      rate: the drop probability; dropped with probability round(rate · 2^16) / 2^16.
      seed: [2] int32 tensor.

    Returns:
      A bool tensor of `shape`, True where an element is kept.
    """
    threshold = tf.constant(round(rate * _LEVELS), tf.uint16)
    shape = tf.convert_to_tensor(shape, tf.int32)
    count = tf.reduce_prod(shape)
    bits = tf.random.stateless_uniform([(count + 1) // 2], seed, minval=None, maxval=None,
                                       dtype=tf.uint32)  # [ceil(n / 2)]
    halves = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:count]  # [n]
    return tf.reshape(halves >= threshold, shape)


def dropout(x, rate, seed):
    """Inverted dropout with `dropout_keep_mask`. The mask is a constant for autodiff: the gradient
    is dy · mask / keep probability.

    Args:
      x: any float tensor.
      rate: the drop probability.
      seed: [2] int32 tensor.

    Returns:
      x with elements zeroed with probability ~rate, the rest scaled by 1 / keep probability.
    """
    if rate == 0:
        return x
    keep_probability = 1.0 - round(rate * _LEVELS) / _LEVELS
    keep = dropout_keep_mask(tf.shape(x), rate, seed)
    scale = tf.where(keep, tf.constant(1.0 / keep_probability, x.dtype),
                     tf.constant(0.0, x.dtype))
    return x * scale


@keras.saving.register_keras_serializable(package="tfnmt")
class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout (same config and seed handling) with the cheaper mask above
    (tf.nn.experimental.stateless_dropout under fast_ops.plain_ops()); without noise_shape
    only. Under a tf.distribute strategy with several replicas, each replica draws its own
    mask, as one large batch on one device would.

    Args:
      rate: fraction of the elements dropped, in training (below 1).
      seed: seed of the layer's random stream (Keras' SeedGenerator).

    Example:
      dropout = Dropout(0.1)
      y = dropout(x, training=True)  # x scaled by 1 / keep probability where kept, 0 elsewhere
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        if noise_shape is not None:
            raise ValueError("tfnmt.layers.Dropout does not take a noise_shape")
        if rate >= 1:
            raise ValueError(f"dropout rate must be below 1, got {rate}")
        super().__init__(rate, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        seed = tf.cast(self.seed_generator.next(), tf.int32)
        # The seed generator's state is the same on every replica (and every worker seeds
        # alike), so replicas would drop the same elements: each folds in its global index.
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            seed = tf.random.experimental.stateless_fold_in(
                seed, tf.cast(context.replica_id_in_sync_group, tf.int32))
        if not fast_ops.enabled():
            return tf.nn.experimental.stateless_dropout(inputs, self.rate, seed)
        return dropout(inputs, self.rate, seed)
