"""x W + b on the last axis, as one 2-D MatMul (+ BiasAdd).

tf.matmul of a [B, T, D] tensor with a [D, F] kernel runs as a broadcasting BatchMatMulV2,
whose kernel gradient is B per-example products summed afterwards; on CPU those sums took
half as long as all the matmuls of a training step (bench/README.md). Folding B and T into
one axis makes both directions plain GEMMs, and MatMul + BiasAdd (+ ReLU) fuse into one
oneDNN kernel.
"""
import tensorflow as tf


def linear(x, kernel, bias=None, transpose_kernel=False):
    """x [..., D_in] · kernel [D_in, D_out] (or [D_out, D_in] transposed) + bias -> [..., D_out],
    computed in x's dtype (the float32 variables are cast, as Keras mixed precision does)."""
    kernel = tf.cast(kernel, x.dtype)
    out_dim = kernel.shape[0] if transpose_kernel else kernel.shape[1]
    flat = tf.reshape(x, [-1, x.shape[-1]])  # [N, D_in]
    y = tf.matmul(flat, kernel, transpose_b=transpose_kernel)  # [N, D_out]
    if bias is not None:
        y = tf.nn.bias_add(y, tf.cast(bias, y.dtype))
    y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [out_dim]], 0))
    y.set_shape(x.shape[:-1].concatenate([out_dim]))
    return y
