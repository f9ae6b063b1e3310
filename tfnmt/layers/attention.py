"""Multi-head scaled dot-product attention (paper §3.2) with masks and a key/value cache."""
import keras
import tensorflow as tf

from tfnmt.layers.dropout import Dropout
from tfnmt.layers.linear import linear, linear_many


def _swap_axes_1_2(x, n1, n2, rest):
    """x holding [n0, n1, n2, rest] -> [n0, n2 * n1, rest], i.e. [n0, n2, n1, rest] with the
    middle axes merged: one gather along axis 1 (oneDNN's transpose is slow on a decoding
    step's small tensors). With n1 and n2 Python ints its indices are constants: no index
    arithmetic at run time, where a decoding step's fixed cost is per op.

    Args:
      x: a tensor of n0 * n1 * n2 * rest elements.
      n1, n2: the axes to swap (ints, or scalar int32 tensors).
      rest: the size of the trailing axes (int or scalar tensor).

    Returns:
      [n0, n2 * n1, rest].
    """
    rows = tf.reshape(x, [-1, n1 * n2, rest])
    if isinstance(n1, int) and isinstance(n2, int):
        if n1 == 1 or n2 == 1:  # a length-1 axis moves by the reshape alone
            return rows
        order = [j * n2 + k for k in range(n2) for j in range(n1)]
    else:
        order = tf.reshape(tf.range(n1)[None, :] * n2 + tf.range(n2)[:, None], [-1])
    return tf.gather(rows, order, axis=1)  # position k * n1 + j: row j * n2 + k


def _small_softmax(logits):
    """softmax over the last axis as exp(x - max) / sum: at a decoding step's sizes (a few
    rows per head) these Eigen ops take a third of the time of oneDNN's softmax kernel, which
    TensorFlow runs by default on CPUs with AVX-512 VNNI or BF16."""
    exp = tf.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True))
    return exp / tf.reduce_sum(exp, axis=-1, keepdims=True)


def _small_matmul(a, b, transpose_b=False):
    """tf.matmul(a, b, transpose_b=...) of a decoding step's few query rows per head; in float32
    by Eigen's batched product on every CPU. Where TensorFlow turns oneDNN on, it replaces the
    BatchMatMulV2 that tf.matmul makes with oneDNN's kernel, whose fixed cost per call is
    several times the product at these sizes (bench/README.md, "Decoding"); it leaves
    BatchMatMulV3 (the same product, with its input and output dtypes as separate attributes)
    to Eigen's kernel. bfloat16 (a mixed-precision model's dev evaluation) keeps tf.matmul:
    there oneDNN's kernel is the faster one at a batch's rows."""
    if a.dtype != tf.float32:
        return tf.matmul(a, b, transpose_b=transpose_b)
    return tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=a.dtype, adj_y=transpose_b)


@keras.saving.register_keras_serializable(package="tfnmt")
class MultiHeadAttention(keras.layers.Layer):
    """softmax(Q K^T / sqrt(d_head) + mask) V over `num_heads` heads, then an output projection.

    Shapes: B batch, Tq query length, Tk key length, D d_model, H heads, Dh = D / H.
    Three ways in, each its own method:
      `call` (mha(query, value, mask)): attention over `value`, as in training.
      `call_cached`: self-attention of new positions over the cached earlier ones; the
        cache (kv_cache.AppendCache or StoreCache) appends their keys and values.
      `call_memory`: cross-attention over keys/values made once by `project_key_value` (the
        encoder output's), shared by groups of consecutive query rows (a sentence's beams).
    `attention_mask` is boolean, True where attending is allowed.

    Args:
      num_heads: number of heads H; must divide d_model.
      d_model: model width D (queries, keys, values and output).
      attention_dropout: dropout rate on the attention weights, in training.
      kernel_initializer: initializer of the four [D, D] projection kernels.

    Example:
      mha = MultiHeadAttention(num_heads=8, d_model=512)
      out = mha(x, memory, mask)  # [B, Tq, D]
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
        # [B, T, D] -> [B, H, T, Dh]; a decoding step's [R, D] -> [R, H, 1, Dh]
        y = linear(x, kernel, bias, training=training)
        if x.shape.rank == 2:  # one position per row: its heads split by a reshape
            return tf.reshape(y, [-1, self.num_heads, 1, self.head_dim])
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        if x.shape[1] == 1:  # a decoding step: moving a length-1 axis is a reshape
            return tf.reshape(y, [batch, self.num_heads, 1, self.head_dim])
        y = tf.reshape(y, [batch, length, self.num_heads, self.head_dim])
        return tf.transpose(y, [0, 2, 1, 3])

    def projection_kernels(self):
        """The query, key and value kernels, each [D, D]: a decoding step's self-attention
        multiplies by all three (`linear.concatenated_kernels` can make them one product)."""
        return [self.query_kernel, self.key_kernel, self.value_kernel]

    def projection_biases(self):
        """The query, key and value biases, each [D]."""
        return [self.query_bias, self.key_bias, self.value_bias]

    def project_key_value(self, value, training=None):
        """Projects keys and values once, for `call_memory` (the encoder's, reused at every
        decoding step).

        Args:
          value: [B, Tk, D].
          training: dropout on.

        Returns:
          {"key", "value"}, each [B, H, Tk, Dh].
        """
        if not self.built:
            self.build()
        return {
            "key": self._project(value, self.key_kernel, self.key_bias, training),
            "value": self._project(value, self.value_kernel, self.value_bias, training),
        }

    def _attend(self, q, k, v, mask, training, step=False):
        """q [B, H, Tq, Dh], k and v [B, H, Tk, Dh], mask broadcastable to [B, 1, Tq, Tk] ->
        (attended [B, H, Tq, Dh], weights [B, H, Tq, Tk] float32). `step`: a decoding step's
        few query rows (`_small_softmax`, `_small_matmul`)."""
        matmul = _small_matmul if step else tf.matmul
        q = q * tf.cast(self.head_dim ** -0.5, q.dtype)
        logits = matmul(q, k, transpose_b=True)
        # Softmax in float32: stable under bf16/fp16 compute and exact masking.
        logits = tf.cast(logits, tf.float32)
        if mask is not None:
            logits = tf.where(mask, logits, tf.constant(-1e9, tf.float32))
        weights = _small_softmax(logits) if step else tf.nn.softmax(logits, axis=-1)
        attended = matmul(self.dropout(tf.cast(weights, v.dtype), training=training), v)
        return attended, weights

    def _output(self, attended, training, rows=False):
        """[B, H, Tq, Dh] -> [B, Tq, D] through the output projection; with `rows` (a decoding
        step's queries, one per row) [R, H, 1, Dh] -> [R, D]."""
        if rows:
            attended = tf.reshape(attended, [-1, self.d_model])
            return linear(attended, self.output_kernel, self.output_bias, training=training)
        batch, length = tf.shape(attended)[0], tf.shape(attended)[2]
        if attended.shape[2] != 1:  # a length-1 axis moves by the reshape alone
            attended = tf.transpose(attended, [0, 2, 1, 3])  # [B, Tq, H, Dh]
        attended = tf.reshape(attended, [batch, length, self.d_model])
        return linear(attended, self.output_kernel, self.output_bias, training=training)

    @staticmethod
    def _mask(attention_mask):
        # [B or 1, Tq or 1, Tk] -> [B or 1, 1, Tq or 1, Tk]
        return None if attention_mask is None else tf.cast(attention_mask, tf.bool)[:, None]

    def call(self, query, value, attention_mask=None, training=None,
             return_attention_scores=False):
        """Attention of `query` over `value` (paper §3.2.2).

        Args:
          query: [B, Tq, D].
          value: [B, Tk, D] (keys and values are both projected from it).
          attention_mask: bool, broadcastable to [B, Tq, Tk]; True where a query may attend.
          training: dropout on.
          return_attention_scores: also return the weights.

        Returns:
          [B, Tq, D], and with return_attention_scores the weights [B, H, Tq, Tk] (float32).
        """
        q = self._project(query, self.query_kernel, self.query_bias, training)
        kv = self.project_key_value(value, training)
        attended, weights = self._attend(q, kv["key"], kv["value"], self._mask(attention_mask),
                                         training)
        output = self._output(attended, training)
        return (output, weights) if return_attention_scores else output

    def call_cached(self, query, cache, attention_mask=None):
        """Self-attention of new positions over the cached ones and themselves (inference).

        Args:
          query: [B, T, D], the new positions, or [B, D]: one new position per row (a
            decoding step: the output is [B, D] too, and no op moves axes).
          cache: a `kv_cache.AppendCache` or `StoreCache` holding t earlier positions; its
            `append` takes the new keys/values.
          attention_mask: needed only when T > 1 (causal among the new positions).

        Returns:
          (output [B, T, D] (or [B, D]), the grown cache, weights [B, H, T, t + T]).
        """
        if query.shape.rank == 2:  # one product inside `linear.concatenated_kernels`
            q, k, v = (tf.reshape(y, [-1, self.num_heads, 1, self.head_dim]) for y in linear_many(
                query, self.projection_kernels(), self.projection_biases()))
        else:
            q = self._project(query, self.query_kernel, self.query_bias)
            step_kv = self.project_key_value(query)
            k, v = step_kv["key"], step_kv["value"]
        k, v, cache = cache.append(k, v)
        attended, weights = self._attend(q, k, v, self._mask(attention_mask), training=False,
                                         step=True)
        return self._output(attended, False, rows=query.shape.rank == 2), cache, weights

    def call_memory(self, query, memory, attention_mask=None, return_attention_scores=False):
        """Cross-attention over projected memory (inference): each memory row is attended by
        its G consecutive query rows together (a sentence's beams), without copying it.

        Args:
          query: [B, Tq, D] with B = Bc * G, or [B, D]: one query per row (the output is
            [B, D] too, the weights [B, H, 1, Tk]).
          memory: {"key", "value"} [Bc, H, Tk, Dh] from `project_key_value`, and optionally
            "groups": G as a Python int (a search's beams per sentence), which makes the
            regrouping of queries a gather by constant indices (fewer ops per step).
          attention_mask: [Bc, 1 or Tq, Tk] bool, per memory row.
          return_attention_scores: also return the weights (regrouping them costs a gather
            per step).

        Returns:
          (output [B, Tq, D], weights [B, H, Tq, Tk] or None).
        """
        rows = query.shape.rank == 2  # one query per row
        q = self._project(query, self.query_kernel, self.query_bias)  # [B, H, Tq, Dh]
        k, v = memory["key"], memory["value"]
        length = 1 if rows else query.shape[1] or tf.shape(q)[2]  # static when known
        heads, row = self.num_heads, self.head_dim * length
        groups = memory.get("groups")
        if not isinstance(groups, int):  # B = Bc * G query rows for Bc memory rows
            groups = tf.shape(q)[0] // tf.shape(k)[0]
        # Per head, the group's queries as one [G * Tq, Dh] matrix, so that each cache row
        # and head is one matrix product (a broadcast batched product of single rows is
        # slower on CPU).
        q = tf.reshape(_swap_axes_1_2(q, groups, heads, row),
                       [-1, heads, groups * length, self.head_dim])  # [Bc, H, G * Tq, Dh]
        mask = attention_mask
        if mask is not None and mask.shape[1] != 1:  # [Bc, Tq, Tk] -> [Bc, G * Tq, Tk]
            mask = tf.tile(tf.cast(mask, tf.bool), [1, groups, 1])
        attended, weights = self._attend(q, k, v, self._mask(mask), training=False, step=True)
        # [Bc, H, G * Tq, .] -> [B, H, Tq, .]
        attended = tf.reshape(_swap_axes_1_2(attended, heads, groups, row),
                              [-1, heads, length, self.head_dim])
        output = self._output(attended, False, rows)
        if not return_attention_scores:
            return output, None
        weights = tf.reshape(_swap_axes_1_2(weights, heads, groups, length * tf.shape(k)[2]),
                             [-1, heads, length, tf.shape(k)[2]])
        return output, weights

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            d_model=self.d_model,
            attention_dropout=self.attention_dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
