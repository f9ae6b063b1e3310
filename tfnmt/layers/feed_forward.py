"""Position-wise feed-forward network (paper §3.3): FFN(x) = act(x W1 + b1) W2 + b2."""
import keras
import tensorflow as tf

from tfnmt.layers.dropout import Dropout
from tfnmt.layers.linear import linear

ACTIVATIONS = {"relu": tf.nn.relu, "gelu": tf.nn.gelu}


@keras.saving.register_keras_serializable(package="tfnmt")
class FeedForward(keras.layers.Layer):
    """Two linear maps with ReLU (paper) or GELU between; optional dropout on the inner layer.

    Args:
      d_model: input and output size D.
      d_ff: inner size F (paper: 4 D).
      activation: "relu" (paper) or "gelu".
      inner_dropout: dropout rate on the inner activations, in training.
      kernel_initializer: initializer of both kernels.

    Example:
      ffn = FeedForward(d_model=512, d_ff=2048)
      y = ffn(x)  # [B, T, D] -> [B, T, D]
    """

    def __init__(self, d_model, d_ff, activation="relu", inner_dropout=0.0,
                 kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.d_model = int(d_model)
        self.d_ff = int(d_ff)
        self.activation = activation
        self.inner_dropout = float(inner_dropout)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dropout = Dropout(self.inner_dropout, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.inner_kernel = self.add_weight(name="inner_kernel", shape=(self.d_model, self.d_ff),
                                            initializer=self.kernel_initializer)
        self.inner_bias = self.add_weight(name="inner_bias", shape=(self.d_ff,),
                                          initializer="zeros")
        self.output_kernel = self.add_weight(name="output_kernel", shape=(self.d_ff, self.d_model),
                                             initializer=self.kernel_initializer)
        self.output_bias = self.add_weight(name="output_bias", shape=(self.d_model,),
                                           initializer="zeros")
        self.built = True

    def call(self, x, training=None):
        # x: [B, T, D] -> [B, T, F] -> [B, T, D]
        h = linear(x, self.inner_kernel, self.inner_bias, activation=ACTIVATIONS[self.activation],
                   training=training)
        h = self.dropout(h, training=training)
        return linear(h, self.output_kernel, self.output_bias, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            d_model=self.d_model,
            d_ff=self.d_ff,
            activation=self.activation,
            inner_dropout=self.inner_dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
