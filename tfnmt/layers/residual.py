"""Residual connection around a sublayer, in post-norm (paper) or pre-norm arrangement."""


def residual_block(x, sublayer, norm, dropout, norm_first, training):
    """A residual connection around a sublayer.
    Post-norm: LayerNorm(x + Dropout(sublayer(x))), as in the paper (§5.4).
    Pre-norm:  x + Dropout(sublayer(LayerNorm(x))), as in the Annotated Transformer.

    Args:
      x: [B, T, D].
      sublayer: a function of [B, T, D] returning a tensor, or a tuple whose first item is the
        tensor (the rest, e.g. a cache or attention weights, is passed through).
      norm: the LayerNorm.
      dropout: the Dropout layer.
      norm_first: pre-norm instead of post-norm.
      training: dropout on.

    Returns:
      (output [B, T, D], the sublayer's extra outputs as a tuple).
    """
    result = sublayer(norm(x, training=training) if norm_first else x)
    extras = ()
    if isinstance(result, tuple):
        result, extras = result[0], result[1:]
    y = x + dropout(result, training=training)
    return (y if norm_first else norm(y, training=training)), extras
