"""x W + b on the last axis, as one 2-D MatMul (+ BiasAdd).

tf.matmul of a [B, T, D] tensor with a [D, F] kernel runs as a broadcasting BatchMatMulV2,
whose kernel gradient is B per-example products summed afterwards, a large part of a CPU
training step (CHANGELOG.md, "Measured gains of the speed-ups"). Folding B and T into
one axis makes both directions plain GEMMs, and MatMul + BiasAdd (+ ReLU) fuse into one
oneDNN kernel.

Inference scopes, which prepare weights once for a search (a search traced inside one takes
what it prepared into its loop as loop-invariant inputs):
  `low_precision_matmuls(kernels, dtype)`: the products with those kernels run in `dtype`, e.g.
    bfloat16 on AMX, with everything around them left in float32;
  `pretransposed_kernels(kernels)`: products with their transposes use a copy transposed once;
  `concatenated_kernels(groups)`: `linear_many` multiplies by a group's kernels side by side
    in one product;
  `sliced_kernels(kernels, slices)`: `linear_slices` multiplies by a kernel's column blocks in
    separate products, which a graph's inter-op threads run side by side.
`kept_copies(copies)` makes the last three keep what they prepare as variables, made once: an
export saves them, so that a served request does not prepare them again.
"""
import contextlib
import threading

import tensorflow as tf

from tfnmt import fast_ops

_low_precision = threading.local()  # .kernels: {id(kernel): (kernel, its cast copy)}


@contextlib.contextmanager
def low_precision_matmuls(kernels, dtype=tf.bfloat16):
    """A scope in which `linear`, outside training, multiplies by any of `kernels` in `dtype`: its
    float32 input is rounded to `dtype`, multiplied by the kernel's `dtype` copy (on CPU a oneDNN
    bf16 GEMM, AMX where present), and the product, itself rounded to `dtype` (TF's CPU MatMul has
    no bf16 x bf16 -> float32 form), is cast back, so that the bias, activation, residuals,
    LayerNorm and softmaxes stay float32.

    The kernels are cast here, once: a search traced inside the scope takes the copies into its
    loop as loop-invariant inputs instead of casting every weight at every step. No fusion applies
    across the casts, so `linear` gives the same bits in a graph as eagerly; for a whole search to
    do so, its other ops must too (see layer_norm.py).

    Args:
      kernels: the float32 kernel variables to multiply by in `dtype`.
      dtype: the product's dtype.

    Example:
      with low_precision_matmuls(model.trainable_variables):
          ids, scores = beam_search(model, source_ids)
    """
    outer = getattr(_low_precision, "kernels", None)
    _low_precision.kernels = dict(outer or {})
    _low_precision.kernels.update({id(kernel): (kernel, tf.cast(kernel, dtype))
                                   for kernel in kernels})
    try:
        yield
    finally:
        _low_precision.kernels = outer


@contextlib.contextmanager
def pretransposed_kernels(kernels):
    """A scope in which `linear`, outside training, multiplies by the transpose of any of
    `kernels` (`transpose_kernel=True`, the tied output layer's x · Eᵀ) through a copy transposed
    here, once, instead of a MatMul with transpose_b. Eigen's MatMul reads a transposed [V, D]
    operand 2-8x slower than a [D, V] one at a decoding step's few rows (bench/README.md,
    "Decoding"); a search traced inside the scope takes the copy into its loop as a
    loop-invariant input. Inside `low_precision_matmuls`, the low-precision copy is the one
    transposed; inside an enclosing scope of the same kernels, its copy is used (a server
    transposes once per request, however many searches the request runs).

    Args:
      kernels: [D_out, D_in] variables that `linear` multiplies by transposed.

    Example:
      with pretransposed_kernels([model.target_embedding.embeddings]):
          ids, scores = beam_search(model, source_ids)
    """
    outer = getattr(_low_precision, "transposed", None)
    _low_precision.transposed = dict(outer or {})
    for kernel in kernels:
        source = _registered("kernels", kernel)
        source = kernel if source is None else source
        copy = _registered("transposed", kernel)
        if copy is not None and tf.as_dtype(copy.dtype) == tf.as_dtype(source.dtype):
            continue  # an enclosing scope's copy serves
        key = ("transposed", id(kernel), tf.as_dtype(source.dtype).name)
        _low_precision.transposed[id(kernel)] = (
            kernel, _kept(key, lambda: tf.transpose(source)))  # [D_in, D_out]
    try:
        yield
    finally:
        _low_precision.transposed = outer


@contextlib.contextmanager
def concatenated_kernels(groups):
    """A scope in which `linear_many(x, kernels, biases)`, outside training, for a group given
    here is one product by the kernels side by side (concatenated here, once; in the
    low-precision dtype of an enclosing `low_precision_matmuls` if it holds them) instead of
    one product per kernel: at a decoding step's few rows a product's fixed cost is a large
    part of its time. Inside an enclosing scope of the same group (and precision), its copy is
    used.

    Args:
      groups: (kernels, biases) pairs: [D_in, D_i] kernels sharing their input, and their [D_i]
        biases.

    Example:
      attention = model.decoder_layers[0].self_attention
      with concatenated_kernels([([attention.query_kernel, attention.key_kernel],
                                  [attention.query_bias, attention.key_bias])]):
          q, k = linear_many(x, [attention.query_kernel, attention.key_kernel],
                             [attention.query_bias, attention.key_bias])
    """
    outer = getattr(_low_precision, "concatenated", None)
    _low_precision.concatenated = dict(outer or {})
    for kernels, biases in groups:
        key = tuple(id(kernel) for kernel in kernels)
        copies = [_registered("kernels", kernel) for kernel in kernels]
        low_precision = all(copy is not None for copy in copies)
        outer_entry = _low_precision.concatenated.get(key)
        if outer_entry is not None and outer_entry[3] == low_precision:
            continue  # an enclosing scope's copy serves
        parts = copies if low_precision else kernels
        kernel = _kept(("concatenated", key, tf.as_dtype(parts[0].dtype).name),
                       lambda: tf.concat(parts, axis=1))
        bias = _kept(("concatenated bias", key), lambda: tf.concat(biases, axis=0))
        _low_precision.concatenated[key] = (kernels, kernel, bias, low_precision,
                                            [k.shape[1] for k in kernels])
    try:
        yield
    finally:
        _low_precision.concatenated = outer


def slice_bounds(width, slices, multiple=32):
    """Where `slices` column blocks of a `width`-wide kernel begin and end: about equal, each
    boundary a multiple of `multiple` (top_log_probs's chunk width), none empty.

    Args:
      width: the kernel's output width.
      slices: how many blocks.
      multiple: what the boundaries are multiples of.

    Returns:
      [0, b_1, ..., width], at most slices + 1 bounds.
    """
    inner = [-(-width * i // (slices * multiple)) * multiple for i in range(1, slices)]
    return sorted({0, width} | {b for b in inner if 0 < b < width})


@contextlib.contextmanager
def sliced_kernels(kernels, slices, transpose=False):
    """A scope in which `linear_slices(x, kernel)`, outside training, for any of `kernels` gives
    `slices` products by column blocks of the kernel (of its transpose with transpose=True),
    copied here once (in the low-precision dtype of an enclosing `low_precision_matmuls` if it
    holds the kernel), instead of one product: independent ops, which a graph's two inter-op
    threads run at once. A search of one sentence leaves a core idle otherwise; its largest
    product, the output layer's, is then split between the cores, and so is what the search
    does with its logits (`decoding.top_log_probs` takes the slices as they are). Inside an
    enclosing scope of the same kernel (and precision), its copies are used.

    Args:
      kernels: [D_in, D_out] variables, or [D_out, D_in] with transpose.
      slices: the number of column blocks (`slice_bounds`).
      transpose: the products are with the kernels' transposes (a tied output layer).

    Example:
      with sliced_kernels([model.target_embedding.embeddings], 2, transpose=True):
          parts = linear_slices(x, model.target_embedding.embeddings)  # 2 x [N, ~V/2]
    """
    outer = getattr(_low_precision, "sliced", None)
    _low_precision.sliced = dict(outer or {})
    for kernel in kernels:
        source = _registered("kernels", kernel)
        low_precision = source is not None
        source = kernel if source is None else source
        outer_entry = _low_precision.sliced.get(id(kernel))
        if outer_entry is not None and outer_entry[2] == low_precision:
            continue  # an enclosing scope's copies serve
        bounds = slice_bounds(kernel.shape[0] if transpose else kernel.shape[1], slices)
        copies = [_kept(("sliced", id(kernel), tf.as_dtype(source.dtype).name, start),
                        lambda source=source, start=start, end=end:
                            _column_block(source, start, end, transpose))
                  for start, end in zip(bounds[:-1], bounds[1:])]
        _low_precision.sliced[id(kernel)] = (kernel, copies, low_precision)
    try:
        yield
    finally:
        _low_precision.sliced = outer


def _column_block(kernel, start, end, transpose):
    """Columns start:end of kernel [D_in, D_out] (of its transpose with transpose) ->
    [D_in, end - start]."""
    return tf.transpose(kernel[start:end]) if transpose else kernel[:, start:end]


@contextlib.contextmanager
def kept_copies(copies):
    """A scope in which `pretransposed_kernels`, `concatenated_kernels` and `sliced_kernels`
    keep what they prepare in `copies`, a dict: run eagerly, each copy is made there as a
    non-trainable tf.Variable of the weights' values at that time (a copy already there is given
    them); traced, a search takes the copy made before (a variable: read at each step, as the
    weights are, and never remade), else prepares its own as outside the scope. An export made
    inside the scope, with the copies saved beside the weights
    (`saved_model.write_saved_model`), spares every request the transposes and concatenations
    (at one sentence per request 3-6% of its time on a Zen 4 EPYC). The copies are snapshots:
    make them again (here, eagerly) after the weights change.

    Args:
      copies: {key: tf.Variable}, filled by eager use.

    Example:
      copies = {}
      with kept_copies(copies), model.decoding_products():
          pass  # eagerly: makes the copies
      with kept_copies(copies):
          tf.saved_model.save(root_holding_the_copies, path, signatures=...)
    """
    outer = getattr(_low_precision, "kept", None)
    _low_precision.kept = copies
    try:
        yield
    finally:
        _low_precision.kept = outer


def _kept(key, make):
    """make()'s tensor, or inside `kept_copies` the variable kept for `key` (made eagerly)."""
    copies = getattr(_low_precision, "kept", None)
    if copies is None:
        return make()
    if tf.executing_eagerly():
        if key in copies:
            copies[key].assign(make())
        else:
            copies[key] = tf.Variable(make(), trainable=False, name="decoding_copy")
    return copies[key] if key in copies else make()


def linear_many(x, kernels, biases, training=False):
    """`[linear(x, kernel, bias) for kernel, bias in zip(kernels, biases)]`, as one product
    inside a `concatenated_kernels` scope that prepared this group (and not training).

    Args:
      x: [..., D_in].
      kernels: [D_in, D_i] kernels.
      biases: their [D_i] biases.
      training: as for `linear` (the products are then separate).

    Returns:
      A list of [..., D_i] in x's dtype.
    """
    entry = (getattr(_low_precision, "concatenated", None) or {}).get(
        tuple(id(kernel) for kernel in kernels))
    if training or not fast_ops.enabled() or entry is None or any(
            a is not b for a, b in zip(entry[0], kernels)):
        return [linear(x, kernel, bias, training=training) for kernel, bias in zip(kernels, biases)]
    _, kernel, bias, low_precision, widths = entry
    kernel = kernel if low_precision else tf.cast(kernel, x.dtype)
    y = _product(_flatten(x), kernel, bias, low_precision, False, x.dtype)  # [N, sum D_i]
    return [_unflatten(part, x, width) for part, width in zip(tf.split(y, widths, axis=1),
                                                                widths)]


def linear_slices(x, kernel, transpose_kernel=False):
    """`linear(x, kernel, transpose_kernel=...)` cut along its last axis: inside a
    `sliced_kernels` scope that prepared this kernel (and not training), one product per
    column block; elsewhere the one product, as a list of one.

    Args:
      x: [..., D_in].
      kernel: [D_in, D_out], or [D_out, D_in] with transpose_kernel.
      transpose_kernel: multiply by the kernel's transpose.

    Returns:
      A list of [..., D_i] in x's dtype, which concatenated give the product.
    """
    entry = (getattr(_low_precision, "sliced", None) or {}).get(id(kernel))
    if not fast_ops.enabled() or entry is None or entry[0] is not kernel:
        return [linear(x, kernel, transpose_kernel=transpose_kernel)]
    _, copies, low_precision = entry
    flat = _flatten(x)  # [N, D_in]
    return [_unflatten(_product(flat, copy if low_precision else tf.cast(copy, x.dtype), None,
                                low_precision, False, x.dtype), x, copy.shape[1])
            for copy in copies]


def _registered(registry, kernel):
    """The copy of `kernel` in one of the inference scopes' registries, or None."""
    entry = (getattr(_low_precision, registry, None) or {}).get(id(kernel))
    return entry[1] if entry is not None and entry[0] is kernel else None


def linear(x, kernel, bias=None, transpose_kernel=False, activation=None, training=False):
    """activation(x · kernel + bias) on the last axis, as one 2-D MatMul (+ BiasAdd), computed in
    x's dtype (the float32 variables are cast, as Keras mixed precision does). The activation is
    applied before the result is reshaped back, so that grappler can fuse MatMul + BiasAdd + ReLU
    (a Reshape in between stops it). Inside `low_precision_matmuls` (and not training) the product
    runs in that scope's dtype. Under `fast_ops.plain_ops()`: tf.matmul + bias, nothing else.

    Args:
      x: [..., D_in].
      kernel: [D_in, D_out], or [D_out, D_in] with transpose_kernel.
      bias: [D_out] or None.
      transpose_kernel: multiply by the kernel's transpose.
      activation: None or an element-wise function (tf.nn.relu, tf.nn.gelu).
      training: the result will be differentiated: a biased map (with ReLU or no activation)
        then takes its gradient from _dense_with_gemm_gradients; elsewhere (inference, exports)
        it stays plain ops.

    Returns:
      [..., D_out] in x's dtype.
    """
    if not fast_ops.enabled():  # stock ops: a broadcasting matmul, as keras.layers.Dense
        y = tf.matmul(x, tf.cast(kernel, x.dtype), transpose_b=transpose_kernel)
        if bias is not None:
            y = y + tf.cast(bias, x.dtype)
        return y if activation is None else activation(y)
    low_precision_kernel = None if training else _registered("kernels", kernel)
    transposed = None if training or not transpose_kernel else _registered("transposed", kernel)
    if transposed is not None:  # [D_in, D_out], in the low-precision dtype if registered so
        transpose_kernel = False
        if tf.as_dtype(transposed.dtype) == tf.as_dtype(kernel.dtype):
            kernel, low_precision_kernel = transposed, None
        else:
            low_precision_kernel = transposed
    kernel = tf.cast(kernel, x.dtype) if low_precision_kernel is None else low_precision_kernel
    out_dim = kernel.shape[0] if transpose_kernel else kernel.shape[1]
    flat = _flatten(x)  # [N, D_in]
    if training and bias is not None and not transpose_kernel and activation in (None, tf.nn.relu):
        y = _dense_with_gemm_gradients(flat, kernel, tf.cast(bias, x.dtype), activation)
    else:
        y = _product(flat, kernel, bias, low_precision_kernel is not None, transpose_kernel,
                     x.dtype)  # [N, D_out]
        if activation is not None:
            y = activation(y)
    return _unflatten(y, x, out_dim)


def _product(flat, kernel, bias, low_precision, transpose_kernel, dtype):
    """flat [N, D_in] · kernel (+ bias) in `dtype`; a `low_precision` kernel's product runs in
    its dtype, with the input rounded to it and the product cast back to `dtype`."""
    if low_precision:
        y = tf.cast(tf.matmul(tf.cast(flat, kernel.dtype), kernel,
                              transpose_b=transpose_kernel), dtype)
    else:
        y = tf.matmul(flat, kernel, transpose_b=transpose_kernel)
    return y if bias is None else tf.nn.bias_add(y, tf.cast(bias, y.dtype))


def _flatten(x):
    """[..., D] -> [N, D] (a rank-2 x as it is)."""
    return x if x.shape.rank == 2 else tf.reshape(x, [-1, x.shape[-1]])


def _unflatten(y, x, out_dim):
    """y [N, out_dim] -> [..., out_dim] with x's leading axes. When only the first of them is
    unknown (a decoding step's [R, 1, D]) the shape is a constant: no Shape, slice and concat
    ops run (at a decoding step's few rows each op's fixed cost is a large part of the step)."""
    if x.shape.rank == 2:
        return y
    inner = x.shape[1:-1]
    if inner.is_fully_defined() and inner.num_elements():  # -1 cannot be inferred beside a 0
        return tf.reshape(y, [-1] + inner.as_list() + [out_dim])
    y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [out_dim]], 0))
    y.set_shape(x.shape[:-1].concatenate([out_dim]))
    return y


def _dense_with_gemm_gradients(x, kernel, bias, activation):
    """activation(x [N, D] · kernel [D, F] + bias [F]) -> [N, F], with the bias gradient as a
    GEMM by a row of ones, which oneDNN runs faster than BiasAddGrad on CPU
    (CHANGELOG.md, "Measured gains of the speed-ups").
    """
    @tf.custom_gradient
    def dense(x, kernel, bias):
        y = tf.nn.bias_add(tf.matmul(x, kernel), bias)  # [N, F]
        if activation is not None:
            y = activation(y)

        def grad(dy):  # [N, F]
            if activation is not None:  # ReLU: dy where the output is positive
                dy = tf.raw_ops.ReluGrad(gradients=dy, features=y)
            ones = tf.ones([1, tf.shape(dy)[0]], dy.dtype)  # [1, N]
            return (tf.matmul(dy, kernel, transpose_b=True),  # [N, D]
                    tf.matmul(x, dy, transpose_a=True),  # [D, F]
                    tf.reshape(tf.matmul(ones, dy), [-1]))  # [F]

        return y, grad

    return dense(x, kernel, bias)
