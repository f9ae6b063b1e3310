"""One decoder layer (paper §3.1): causal self-attention, cross-attention, feed-forward."""
import keras

from tfnmt.layers.attention import MultiHeadAttention
from tfnmt.layers.encoder_layer import TransformerEncoderLayer
from tfnmt.layers.layer_norm import LayerNorm
from tfnmt.layers.residual import residual_block


@keras.saving.register_keras_serializable(package="tfnmt")
class TransformerDecoderLayer(TransformerEncoderLayer):
    """The encoder layer's two sublayers plus cross-attention over the encoder output.

    `call` runs whole target sequences (teacher forcing); `call_cached` runs new positions
    against a cache {"self": a kv_cache.AppendCache or StoreCache, "memory": `memory_cache`}
    of the earlier ones and of the encoder output.

    Args: those of `TransformerEncoderLayer`.

    Example:
      layer = TransformerDecoderLayer(d_model=512, num_heads=8, d_ff=2048)
      y = layer(x, memory, causal_mask, memory_mask)  # [B, T, D]
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cross_attention = MultiHeadAttention(self.num_heads, self.d_model,
                                                  self.attention_dropout,
                                                  dtype=self.dtype_policy, name="cross_attention")
        self.cross_attention_norm = LayerNorm(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="cross_attention_norm")

    def build(self, input_shape=None):
        super().build(input_shape)
        shape = (None, None, self.d_model)
        self.cross_attention.build(shape, shape)
        self.cross_attention_norm.build(shape)

    def memory_cache(self, memory):
        """The cross-attention keys/values of the encoder output, for `call_cached`.

        Args:
          memory: [B, S, D], the encoder output.

        Returns:
          {"key", "value"}, each [B, H, S, Dh].
        """
        return self.cross_attention.project_key_value(memory)

    def call(self, x, memory, self_attention_mask=None, memory_mask=None, training=None,
             return_attention_scores=False):
        """Teacher-forced decoder layer.

        Args:
          x: [B, T, D] decoder states.
          memory: [B, S, D] encoder output.
          self_attention_mask: [B or 1, T, T] bool (causal, plus target padding if any).
          memory_mask: [B, 1, S] bool (source padding).
          training: dropout on.
          return_attention_scores: also return the weights.

        Returns:
          x [B, T, D], and with return_attention_scores {"self": [B, H, T, T],
          "cross": [B, H, T, S]}.
        """
        ret = return_attention_scores
        x, self_extras = residual_block(
            x,
            lambda h: self.self_attention(h, h, self_attention_mask, training=training,
                                          return_attention_scores=ret),
            self.self_attention_norm, self.dropout, self.norm_first, training)
        x, cross_extras = residual_block(
            x,
            lambda h: self.cross_attention(h, memory, memory_mask, training=training,
                                           return_attention_scores=ret),
            self.cross_attention_norm, self.dropout, self.norm_first, training)
        x = self._feed_forward_block(x, training)
        if ret:
            return x, {"self": self_extras[0], "cross": cross_extras[0]}
        return x

    def call_cached(self, x, cache, memory_mask=None, self_attention_mask=None,
                    return_attention_scores=False):
        """Incremental decoder layer (inference: no dropout).

        Args:
          x: [B, T, D] new positions, or [B, D]: one new position per row (a decoding step;
            no self_attention_mask needed, and the output is [B, D]).
          cache: {"self": a key/value cache, "memory": `memory_cache`'s [Bc, H, S, Dh]} with
            B = Bc * G rows (a sentence's beams query its memory row together).
          memory_mask: [Bc, 1, S] bool (source padding).
          self_attention_mask: [B or 1, T, t + T] bool, for T > 1.
          return_attention_scores: also return the weights.

        Returns:
          (x [B, T, D] (or [B, D]), the cache with the new positions, {"self", "cross"}
          weights or None).
        """
        x, (self_cache, self_weights) = residual_block(
            x, lambda h: self.self_attention.call_cached(h, cache["self"], self_attention_mask),
            self.self_attention_norm, self.dropout, self.norm_first, False)
        x, (cross_weights,) = residual_block(
            x, lambda h: self.cross_attention.call_memory(h, cache["memory"], memory_mask,
                                                          return_attention_scores),
            self.cross_attention_norm, self.dropout, self.norm_first, False)
        x = self._feed_forward_block(x, False)
        weights = None
        if return_attention_scores:
            weights = {"self": self_weights, "cross": cross_weights}
        return x, {"self": self_cache, "memory": cache["memory"]}, weights
