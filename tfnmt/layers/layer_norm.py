"""Layer normalisation over the last axis (Ba et al., 2016) with a closed-form gradient.

keras.layers.LayerNormalization builds LN from moments + broadcasting ops and leaves the
gradient to autodiff: on CPU, where every element-wise op is one pass over memory, that is
many passes per LayerNorm (CHANGELOG.md, "Measured gains of the speed-ups"). Here the
forward keeps x̂ and 1/σ, and the backward is the textbook expression
    dx = (g - mean(g) - x̂ · mean(g · x̂)) / σ,   g = dy · γ,
in fewer passes. That path is for training only (and off under fast_ops.plain_ops()). Outside it
(decoding, export) the layer runs (x - mean) · (rsqrt(var + ε) · γ) + β: fewer and cheaper passes
than tf.nn.batch_normalization's broadcasting products (at a 64-row search step 19 against 32-38 µs
per LayerNorm, bench/layer_norm.py), and a form grappler leaves as written, so a graph gives eager
code's bits (a last-bit difference would flip the bf16 rounding of the next matmul's input under
`linear.low_precision_matmuls`). Statistics are computed in float32 under any policy, as Keras does.
The variables are named `gamma` and `beta` like Keras's, so checkpoints carry over.
"""
import keras
import tensorflow as tf

from tfnmt import fast_ops


def layer_norm(x, gamma, beta, epsilon, dtype=None):
    """LayerNorm over the last axis, with the closed-form gradient when fast ops are on.

    Args:
      x: [..., D].
      gamma, beta: [D] float32 scale and offset.
      epsilon: added to the variance.
      dtype: the result's dtype (default x's).

    Returns:
      [..., D] in `dtype`.
    """
    dtype = tf.as_dtype(dtype or x.dtype)

    @tf.custom_gradient
    def normalise(x, gamma, beta):
        xf = tf.cast(x, tf.float32)
        centered = xf - tf.reduce_mean(xf, axis=-1, keepdims=True)  # [..., D]
        inv_std = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
                                + epsilon)  # [..., 1]
        normalised = centered * inv_std  # x̂ [..., D]
        y = tf.cast(normalised * gamma + beta, dtype)

        def grad(upstream):
            dy = tf.cast(upstream, tf.float32)
            g = dy * gamma
            dx = inv_std * (g - tf.reduce_mean(g, axis=-1, keepdims=True)
                            - normalised * tf.reduce_mean(g * normalised, axis=-1, keepdims=True))
            outer_axes = list(range(len(x.shape) - 1))
            return (tf.cast(dx, x.dtype), tf.reduce_sum(dy * normalised, axis=outer_axes),
                    tf.reduce_sum(dy, axis=outer_axes))

        return y, grad

    return normalise(x, tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32))


@keras.saving.register_keras_serializable(package="tfnmt")
class LayerNorm(keras.layers.Layer):
    """y = γ · (x − mean) / sqrt(var + ε) + β over the last axis; output in the compute dtype.

    Args:
      epsilon: ε, added to the variance.

    Example:
      norm = LayerNorm(epsilon=1e-6)
      y = norm(x)  # [..., D] -> [..., D]
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        self.autocast = False  # inputs are normalised in float32 whatever their dtype

    def build(self, input_shape):
        dim = input_shape[-1]
        self.gamma = self.add_weight(name="gamma", shape=(dim,), initializer="ones",
                                     autocast=False)
        self.beta = self.add_weight(name="beta", shape=(dim,), initializer="zeros",
                                    autocast=False)
        self.built = True

    def call(self, x, training=None):
        # x: [..., D] -> [..., D]
        if training and fast_ops.enabled():
            return layer_norm(x, self.gamma, self.beta, self.epsilon, self.compute_dtype)
        x = tf.cast(x, tf.float32)
        centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)  # [..., D]
        variance = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)  # [..., 1]
        scale = tf.math.rsqrt(variance + self.epsilon) * self.gamma  # [..., D]
        return tf.cast(centred * scale + self.beta, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config
