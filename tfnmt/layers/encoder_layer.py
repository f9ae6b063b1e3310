"""One encoder layer (paper §3.1): self-attention and a feed-forward network, each residual."""
import keras

from tfnmt.layers.attention import MultiHeadAttention
from tfnmt.layers.dropout import Dropout
from tfnmt.layers.feed_forward import FeedForward
from tfnmt.layers.layer_norm import LayerNorm
from tfnmt.layers.residual import residual_block


@keras.saving.register_keras_serializable(package="tfnmt")
class TransformerEncoderLayer(keras.layers.Layer):
    """x -> self-attention over the unpadded source -> FFN, with residual + dropout + LayerNorm.

    Args:
      d_model: model width D.
      num_heads: attention heads (must divide D).
      d_ff: feed-forward inner size.
      dropout: rate on each sublayer's output before the residual sum (paper: 0.1).
      attention_dropout: rate on the attention weights.
      ffn_dropout: rate on the feed-forward inner activations.
      activation: "relu" (paper) or "gelu".
      norm_first: pre-norm (LayerNorm before each sublayer) instead of the paper's post-norm.
      layer_norm_epsilon: ε of the LayerNorms.

    Example:
      layer = TransformerEncoderLayer(d_model=512, num_heads=8, d_ff=2048)
      y = layer(x, padding_mask)  # x [B, S, D], padding_mask [B, S] (True at tokens)
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, attention_dropout=0.0,
                 ffn_dropout=0.0, activation="relu", norm_first=False, layer_norm_epsilon=1e-6,
                 **kwargs):
        super().__init__(**kwargs)
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.d_ff = int(d_ff)
        self.dropout_rate = float(dropout)
        self.attention_dropout = float(attention_dropout)
        self.ffn_dropout = float(ffn_dropout)
        self.activation = activation
        self.norm_first = bool(norm_first)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

        self.self_attention = MultiHeadAttention(num_heads, d_model, attention_dropout,
                                                 dtype=self.dtype_policy, name="self_attention")
        self.feed_forward = FeedForward(d_model, d_ff, activation, ffn_dropout,
                                        dtype=self.dtype_policy, name="feed_forward")
        # LayerNorm statistics in float32 even under a mixed policy (Keras does this for LN).
        self.self_attention_norm = LayerNorm(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="self_attention_norm")
        self.feed_forward_norm = LayerNorm(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="feed_forward_norm")
        self.dropout = Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        shape = (None, None, self.d_model)
        self.self_attention.build(shape, shape)
        self.feed_forward.build(shape)
        self.self_attention_norm.build(shape)
        self.feed_forward_norm.build(shape)
        self.built = True

    def call(self, x, padding_mask=None, training=None, return_attention_scores=False):
        """Encoder layer.

        Args:
          x: [B, S, D].
          padding_mask: [B, S] bool, True at real tokens.
          training: dropout on.
          return_attention_scores: also return the self-attention weights.

        Returns:
          [B, S, D], and with return_attention_scores the weights [B, H, S, S].
        """
        mask = None if padding_mask is None else padding_mask[:, None, :]  # [B, 1, S]
        x, extras = residual_block(
            x,
            lambda h: self.self_attention(h, h, mask, training=training,
                                          return_attention_scores=return_attention_scores),
            self.self_attention_norm, self.dropout, self.norm_first, training)
        x = self._feed_forward_block(x, training)
        return (x, extras[0]) if return_attention_scores else x

    def _feed_forward_block(self, x, training):
        x, _ = residual_block(x, lambda h: self.feed_forward(h, training=training),
                              self.feed_forward_norm, self.dropout, self.norm_first, training)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(
            d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
            dropout=self.dropout_rate, attention_dropout=self.attention_dropout,
            ffn_dropout=self.ffn_dropout, activation=self.activation,
            norm_first=self.norm_first, layer_norm_epsilon=self.layer_norm_epsilon,
        )
        return config
