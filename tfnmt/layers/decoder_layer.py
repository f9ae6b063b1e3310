"""One decoder layer (paper §3.1): causal self-attention, cross-attention, feed-forward."""
import keras

from tfnmt.layers.attention import MultiHeadAttention
from tfnmt.layers.encoder_layer import TransformerEncoderLayer
from tfnmt.layers.layer_norm import LayerNorm
from tfnmt.layers.residual import residual_block


@keras.saving.register_keras_serializable(package="tfnmt")
class TransformerDecoderLayer(TransformerEncoderLayer):
    """The encoder layer's two sublayers plus cross-attention over the encoder output.

    Incremental decoding passes `cache = {"self": {"key", "value"}, "memory": {"key", "value"}}`:
    the self-attention cache grows by the new step, the memory cache (see `memory_cache`) is the
    encoder output's keys/values projected once per sentence.
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
        """Cross-attention keys/values of the encoder output [B, S, D] -> {key, value} [B,H,S,Dh]."""
        return self.cross_attention.project_key_value(memory)

    def call(self, x, memory=None, self_attention_mask=None, memory_mask=None, cache=None,
             training=None, return_attention_scores=False):
        """x: [B, T, D] decoder states; memory: [B, S, D] encoder output (unused with a cache);
        self_attention_mask: [B or 1, T, Tk] bool (causal, plus target padding if any);
        memory_mask: [B, 1, S] bool (source padding).
        Returns x [B, T, D]; then the new cache if one was given; then
        {"self": [B,H,T,Tk], "cross": [B,H,T,S]} weights if asked."""
        ret = return_attention_scores
        x, self_extras = residual_block(
            x,
            lambda h: self.self_attention(h, h, self_attention_mask,
                                          cache=None if cache is None else cache["self"],
                                          training=training, return_attention_scores=ret),
            self.self_attention_norm, self.dropout, self.norm_first, training)
        x, cross_extras = residual_block(
            x,
            lambda h: self.cross_attention(h, memory, memory_mask,
                                           cache=None if cache is None else cache["memory"],
                                           static_kv=cache is not None,
                                           training=training, return_attention_scores=ret),
            self.cross_attention_norm, self.dropout, self.norm_first, training)
        x, _ = residual_block(x, lambda h: self.feed_forward(h, training=training),
                              self.feed_forward_norm, self.dropout, self.norm_first, training)
        result = (x,)
        if cache is not None:
            result += ({"self": self_extras[0], "memory": cache["memory"]},)
        if ret:
            result += ({"self": self_extras[-1], "cross": cross_extras[-1]},)
        return result[0] if len(result) == 1 else result
