"""Residual connection around a sublayer, in post-norm (paper) or pre-norm arrangement."""


def residual_block(x, sublayer, norm, dropout, norm_first, training):
    """Post-norm: LayerNorm(x + Dropout(sublayer(x))), as in the paper (§5.4).
    Pre-norm:  x + Dropout(sublayer(LayerNorm(x))), as in the Annotated Transformer.

    `sublayer` returns either a tensor or a tuple whose first item is the tensor; the rest of the
    tuple (cache, attention weights) is passed through: returns (output, extras).
    """
    result = sublayer(norm(x, training=training) if norm_first else x)
    extras = ()
    if isinstance(result, tuple):
        result, extras = result[0], result[1:]
    y = x + dropout(result, training=training)
    return (y if norm_first else norm(y, training=training)), extras
