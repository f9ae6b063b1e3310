"""Multi-head scaled dot-product attention (paper §3.2) with masks and a key/value cache."""
import keras
import tensorflow as tf

from tfnmt import kv_cache
from tfnmt.layers.dropout import Dropout
from tfnmt.layers.linear import linear


def _swap_axes_1_2(x, n0, n1, n2):
    """x holding [n0, n1, n2, ...] -> [n0, n2, n1, rest] (rest: the remaining axes flattened).
    A row gather: oneDNN's transpose is slow on the small tensors of a decoding step."""
    rows = tf.reshape(x, [n0 * n1 * n2, -1])
    index = (tf.range(n0)[:, None, None] * n1 + tf.range(n1)) * n2 + tf.range(n2)[:, None]
    return tf.gather(rows, index)  # index [n0, n2, n1]


@keras.saving.register_keras_serializable(package="tfnmt")
class MultiHeadAttention(keras.layers.Layer):
    """softmax(Q K^T / sqrt(d_head) + mask) V over `num_heads` heads, then an output projection.

    Call forms (shapes: B batch, Tq query length, Tk key length, D d_model, H heads, Dh = D/H):
      out = mha(query, value, attention_mask)                        # [B, Tq, D]
      out, cache = mha(query, query, mask, cache=cache)              # self-attention, incremental
      out, cache = mha(query, None, mask, cache=kv, static_kv=True)  # cross-attention, precomputed
    `attention_mask` is boolean, True where attending is allowed, broadcastable to [B, Tq, Tk].
    A cache is {"key": [B, H, Tc, Dh], "value": [B, H, Tc, Dh]}: the new step's keys/values are
    appended to it (self-attention), or it is used as is (`static_kv`, the encoder memory made once
    with `project_key_value`). With "write_rows" and "read_rows" in a self-attention cache, its
    "key" and "value" are in-place stores instead (kv_cache.py): the new keys are written there
    and each row's are read back. A static cache may hold one row per group of G consecutive query
    rows (B = Bc * G; e.g. the G beams of a sentence share its encoder keys/values): each
    group's queries then attend to their row together (the row is not copied), and the mask
    is per cache row ([Bc, 1 or Tq, Tk]). With `return_attention_scores=True` the weights
    [B, H, Tq, Tk] are appended to the returned tuple.
    """

    def __init__(self, num_heads, d_model, attention_dropout=0.0,
                 kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = int(num_heads)
        self.d_model = int(d_model)
        self.head_dim = self.d_model // self.num_heads
        self.attention_dropout = float(attention_dropout)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dropout = Dropout(self.attention_dropout, dtype=self.dtype_policy)

    def build(self, query_shape=None, value_shape=None):
        def dense(name):
            kernel = self.add_weight(name=f"{name}_kernel", shape=(self.d_model, self.d_model),
                                     initializer=self.kernel_initializer)
            bias = self.add_weight(name=f"{name}_bias", shape=(self.d_model,), initializer="zeros")
            return kernel, bias

        self.query_kernel, self.query_bias = dense("query")
        self.key_kernel, self.key_bias = dense("key")
        self.value_kernel, self.value_bias = dense("value")
        self.output_kernel, self.output_bias = dense("output")
        self.built = True

    def _project(self, x, kernel, bias, training=None):
        # [B, T, D] -> [B, H, T, Dh]
        y = linear(x, kernel, bias, training=training)
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        y = tf.reshape(y, [batch, length, self.num_heads, self.head_dim])
        return tf.transpose(y, [0, 2, 1, 3])

    def project_key_value(self, value, training=None):
        """Keys and values of `value` ([B, Tk, D]) as a static cache, e.g. for the encoder memory."""
        if not self.built:
            self.build()
        return {
            "key": self._project(value, self.key_kernel, self.key_bias, training),
            "value": self._project(value, self.value_kernel, self.value_bias, training),
        }

    def call(self, query, value=None, attention_mask=None, cache=None, static_kv=False,
             training=None, return_attention_scores=False):
        q = self._project(query, self.query_kernel, self.query_bias, training)  # [B, H, Tq, Dh]
        batch, length = tf.shape(q)[0], tf.shape(q)[2]
        if static_kv:
            k, v = cache["key"], cache["value"]  # [Bc, H, Tk, Dh], B = Bc * G
            # G query rows per cache row: per head, the group's queries as one [G * Tq, Dh]
            # matrix, so that each cache row and head is one matrix product (a broadcast
            # batched product of single rows is slower on CPU).
            cache_rows = tf.shape(k)[0]
            groups = batch // cache_rows
            q = tf.reshape(_swap_axes_1_2(q, cache_rows, groups, self.num_heads),
                           [cache_rows, self.num_heads, -1, self.head_dim])  # [Bc, H, G*Tq, Dh]
        else:
            step_kv = self.project_key_value(value, training)
            k, v = step_kv["key"], step_kv["value"]
            if cache is not None and "write_rows" in cache:  # in-place stores (kv_cache.py)
                key_store, k = kv_cache.write_and_read(cache["key"], k, cache["write_rows"],
                                                       cache["read_rows"])
                value_store, v = kv_cache.write_and_read(cache["value"], v, cache["write_rows"],
                                                         cache["read_rows"])
                cache = {"key": key_store, "value": value_store}
            elif cache is not None:
                k = tf.concat([cache["key"], k], axis=2)
                v = tf.concat([cache["value"], v], axis=2)
                cache = {"key": k, "value": v}
        q = q * tf.cast(self.head_dim ** -0.5, q.dtype)
        logits = tf.matmul(q, k, transpose_b=True)  # [B, H, Tq, Tk] ([Bc, H, G * Tq, Tk])
        # Softmax in float32: stable under bf16/fp16 compute and exact masking.
        logits = tf.cast(logits, tf.float32)
        if attention_mask is not None:
            mask = tf.cast(attention_mask, tf.bool)
            if static_kv and mask.shape[1] != 1:  # [Bc, Tq, Tk] -> [Bc, G * Tq, Tk]
                mask = tf.tile(mask, [1, groups, 1])
            mask = mask[:, None]  # [B, 1, Tq, Tk] ([Bc, 1, G * Tq or 1, Tk])
            logits = tf.where(mask, logits, tf.constant(-1e9, tf.float32))
        weights = tf.nn.softmax(logits, axis=-1)
        attended = tf.matmul(self.dropout(tf.cast(weights, v.dtype), training=training), v)
        if static_kv:  # [Bc, H, G * Tq, .] -> [B, H, Tq, .]
            attended = tf.reshape(_swap_axes_1_2(attended, cache_rows, self.num_heads, groups),
                                  [batch, self.num_heads, length, self.head_dim])
            if return_attention_scores:
                weights = tf.reshape(_swap_axes_1_2(weights, cache_rows, self.num_heads, groups),
                                     [batch, self.num_heads, length, -1])
        attended = tf.transpose(attended, [0, 2, 1, 3])  # [B, Tq, H, Dh]
        attended = tf.reshape(attended, [batch, length, self.d_model])
        output = linear(attended, self.output_kernel, self.output_bias,
                        training=training)  # [B, Tq, D]

        result = (output,)
        if cache is not None:
            result += (cache,)
        if return_attention_scores:
            result += (weights,)
        return result[0] if len(result) == 1 else result

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            d_model=self.d_model,
            attention_dropout=self.attention_dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
