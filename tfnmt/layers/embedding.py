"""Token embeddings scaled by sqrt(d_model) (paper §3.4) and positional encodings (§3.5)."""
import math

import keras
import tensorflow as tf

from tfnmt.layers.linear import linear


@keras.saving.register_keras_serializable(package="tfnmt")
class TokenEmbedding(keras.layers.Layer):
    """Looks up token vectors and multiplies them by sqrt(d_model).

    The same matrix doubles as the pre-softmax projection (`logits`), which is how the paper
    shares source, target and output weights when the vocabulary is shared.

    Args:
      vocab_size: number of token ids V.
      d_model: vector size D.
      embeddings_initializer: initializer of the [V, D] matrix.

    Example:
      embedding = TokenEmbedding(vocab_size=8000, d_model=512)
      vectors = embedding(token_ids)          # [B, T] -> [B, T, D]
      logits = embedding.logits(decoder_out)  # [B, T, D] -> [B, T, V]
    """

    def __init__(self, vocab_size, d_model, embeddings_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, token_ids):
        # token_ids: [B, T] int -> [B, T, D]
        vectors = tf.gather(tf.convert_to_tensor(self.embeddings), token_ids)
        return vectors * tf.cast(math.sqrt(self.d_model), vectors.dtype)

    def logits(self, hidden):
        """The pre-softmax projection with the (transposed) embedding matrix (paper §3.4).

        Args:
          hidden: [B, T, D].

        Returns:
          [B, T, V] logits in the compute dtype.
        """
        if not self.built:
            self.build()
        return linear(hidden, self.embeddings, transpose_kernel=True)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config


def sinusoid_table(positions, d_model):
    """The paper's positional encodings (§3.5): PE(pos, 2i) = sin(pos / 10000^(2i/d)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    Args:
      positions: [T] positions.
      d_model: D.

    Returns:
      [T, D] float32.
    """
    angles = tf.cast(positions, tf.float32)[:, None] * _inverse_frequencies(d_model)  # [T, D/2]
    return tf.reshape(_interleave_sin_cos(angles), [-1, d_model])


def _inverse_frequencies(d_model):
    """1 / 10000^(2i/d) for i < D/2: [D/2] float32."""
    dims = tf.range(d_model // 2, dtype=tf.float32)
    return tf.exp(-math.log(10000.0) * 2.0 * dims / d_model)


def _interleave_sin_cos(angles):
    """[..., D/2] -> [..., D/2, 2]: column 2i is sin and 2i+1 is cos, as written in the paper."""
    return tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1)


@keras.saving.register_keras_serializable(package="tfnmt")
class PositionalEncoding(keras.layers.Layer):
    """Adds position information: fixed sinusoids (paper default) or learned vectors.

    `start` offsets the positions, so incremental decoding can add the encoding of step t alone.
    Sinusoids have no length limit; learned positions cover `max_length` positions.

    Args:
      d_model: vector size D (even).
      kind: "sinusoidal" (paper §3.5) or "learned".
      max_length: positions a learned table holds.

    Example:
      positions = PositionalEncoding(d_model=512)
      x = positions(embedded)            # [B, T, D] -> [B, T, D]
      x_t = positions(step_vectors, start=t)  # one decoding step at position t
    """

    def __init__(self, d_model, kind="sinusoidal", max_length=1024, **kwargs):
        super().__init__(**kwargs)
        if kind not in ("sinusoidal", "learned"):
            raise ValueError(f"position kind must be 'sinusoidal' or 'learned', got {kind!r}")
        if d_model % 2:
            raise ValueError(f"d_model must be even for positional encodings, got {d_model}")
        self.d_model = int(d_model)
        self.kind = kind
        self.max_length = int(max_length)

    def build(self, input_shape=None):
        if self.kind == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.max_length, self.d_model),
                initializer="glorot_uniform",
            )
        self.built = True

    def at(self, position):
        """The encoding of one position (a decoding step's), without a table.

        Args:
          position: a scalar int.

        Returns:
          [D] float32 (learned: the variable's dtype).
        """
        if self.kind == "learned":
            return tf.gather(tf.convert_to_tensor(self.position_embeddings), position)
        angles = tf.cast(position, tf.float32) * _inverse_frequencies(self.d_model)  # [D/2]
        return tf.reshape(_interleave_sin_cos(angles), [self.d_model])

    def call(self, inputs, start=0):
        # inputs: [B, T, D] -> [B, T, D]
        length = tf.shape(inputs)[1]
        positions = tf.range(length) + tf.cast(start, tf.int32)
        if self.kind == "sinusoidal":
            table = sinusoid_table(positions, self.d_model)
        else:
            table = tf.gather(tf.convert_to_tensor(self.position_embeddings), positions)
        return inputs + tf.cast(table, inputs.dtype)[None]

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, kind=self.kind, max_length=self.max_length)
        return config
