"""Label-smoothed, padding-masked cross-entropy (paper §5.4) and masked token accuracy.

Everything returns sums and counts rather than means: under tf.distribute each replica sees a
part of the batch, so the training loop divides the summed loss by the *global* number of real
target tokens (otherwise the loss is mis-scaled by the replica count and batch composition).
"""
import tensorflow as tf

from tfnmt import fast_ops
from tfnmt.data.special_tokens import PAD_ID

# `_softmax_statistics` does not subtract a row's largest logit where the row's log-sum of exp(z)
# lies within ±this: no exp overflows, the terms that matter stay normal floats, and a bf16 copy
# of exp(z) times a kernel stays far below bf16's largest value.
NORMALISER_RANGE = 40.0


def label_smoothed_cross_entropy(labels, logits, epsilon=0.1, pad_id=PAD_ID):
    """Label-smoothed cross-entropy per token.

    The smoothed target q puts 1 - epsilon on the label and spreads epsilon evenly over the other
    V - 2 tokens, leaving none on padding, as the Annotated Transformer does:
        loss = -(1 - eps) log p(y) - eps / (V - 2) * sum_{j not in {y, pad}} log p(j)
    computed from logsumexp and the logits' sum, with the closed-form gradient softmax(z) - q
    (see _smoothed_xent).

    Args:
      labels: [B, T] int target ids, pad_id at padding.
      logits: [B, T, V] (any float dtype; computed in float32).
      epsilon: the label smoothing (paper: 0.1).
      pad_id: the padding id.

    Returns:
      (loss [B, T], 0 at padding; weights [B, T], 1.0 at real tokens), float32.
    """
    logits = tf.cast(logits, tf.float32)
    weights = tf.cast(tf.not_equal(labels, pad_id), tf.float32)
    if not fast_ops.enabled():
        return _plain_smoothed_xent(labels, logits, epsilon, pad_id) * weights, weights
    return _smoothed_xent(labels, logits, epsilon, pad_id) * weights, weights


def _plain_smoothed_xent(labels, logits, epsilon, pad_id):
    """The same loss as -sum(q · log_softmax(logits)) over an explicit [B, T, V] target q,
    differentiated by autodiff (fast_ops.plain_ops())."""
    vocab_size = tf.shape(logits)[-1]
    off_value = epsilon / (tf.cast(vocab_size, tf.float32) - 2.0)
    q = tf.one_hot(labels, vocab_size, on_value=1.0 - epsilon, off_value=off_value)
    q = tf.where(tf.equal(tf.range(vocab_size), pad_id), 0.0, q)  # [B, T, V]
    return -tf.reduce_sum(q * tf.nn.log_softmax(logits), axis=-1)


def _smoothed_xent(labels, logits, epsilon, pad_id):
    """Smoothed cross-entropy [B, T] of logits [B, T, V] (float32).

    Autodiff of log_softmax + gather would make several passes over the [B, T, V] logits and
    scatter the label gradient with UnsortedSegmentSum (about a sixth of a CPU training step's
    op time before this); the gradient is just softmax(z) - q, with q the smoothed target,
    written as one dense expression and one sparse correction (the label and pad columns).
    """
    vocab_size = tf.shape(logits)[-1]
    others_count = tf.cast(vocab_size, tf.float32) - 2.0  # tokens other than label and pad
    off_value = epsilon / others_count  # q of each of them

    @tf.custom_gradient
    def xent(logits):
        shifted_exp, normaliser, log_normaliser = _softmax_statistics(logits)  # [B, T, (V)]
        label_logit = tf.gather(logits, labels, batch_dims=2)  # [B, T]
        loss = _smoothed_loss(log_normaliser, label_logit, tf.reduce_sum(logits, axis=-1),
                              logits[..., pad_id], epsilon, others_count)

        def grad(upstream):  # upstream [B, T]
            probs = shifted_exp * (1.0 / normaliser)[..., None]  # softmax [B, T, V]
            flat = tf.reshape(probs - off_value, [-1, vocab_size])  # p - q off the two columns
            rows = tf.range(tf.shape(flat)[0])
            # q(label) = 1 - eps and q(pad) = 0 instead of off_value, as one scatter (labels at
            # padding positions get both corrections; their upstream weight is 0).
            index = tf.concat([tf.stack([rows, tf.reshape(labels, [-1])], axis=1),
                               tf.stack([rows, tf.fill(tf.shape(rows), pad_id)], axis=1)], 0)
            correction = tf.concat([tf.fill(tf.shape(rows), off_value - 1.0 + epsilon),
                                    tf.fill(tf.shape(rows), off_value)], 0)
            flat = tf.tensor_scatter_nd_add(flat, index, correction)
            return tf.reshape(flat, tf.shape(logits)) * upstream[..., None]

        return loss, grad

    return xent(logits)


def _softmax_statistics(logits):
    """logsumexp by hand over the last axis of logits [..., V], keeping exp(z - c) for the
    gradient (no second exp pass): (exp(z - c) [..., V], its sum [...], logsumexp [...]), c = 0
    for the rows whose sum of exp(z) lies within [e^-NORMALISER_RANGE, e^NORMALISER_RANGE] (no
    pass for the rows' maxima nor for subtracting them), else c = the row's max."""
    plain_exp = tf.exp(logits)
    normaliser = tf.reduce_sum(plain_exp, axis=-1)  # [...]
    log_normaliser = tf.math.log(normaliser)

    def shifted():
        row_max = tf.reduce_max(logits, axis=-1, keepdims=True)  # [..., 1]
        shifted_exp = tf.exp(logits - row_max)
        shifted_sum = tf.reduce_sum(shifted_exp, axis=-1)
        return shifted_exp, shifted_sum, tf.math.log(shifted_sum) + row_max[..., 0]

    in_range = tf.abs(log_normaliser) <= NORMALISER_RANGE  # [...]; False for NaN too

    def per_row():  # only the rows out of range shifted: the others' values do not change
        shifted_exp, shifted_sum, shifted_log = shifted()
        return (tf.where(in_range[..., None], plain_exp, shifted_exp),
                tf.where(in_range, normaliser, shifted_sum),
                tf.where(in_range, log_normaliser, shifted_log))

    return tf.cond(tf.reduce_all(in_range), lambda: (plain_exp, normaliser, log_normaliser),
                   per_row)


def _smoothed_loss(log_normaliser, label_logit, logit_sum, pad_logit, epsilon, others_count):
    """-(1 - eps) log p(y) - eps / (V - 2) * sum_{j not in {y, pad}} log p(j), from the log of
    the softmax normaliser, the label's and pad's logits and the sum of all logits."""
    loss = (1.0 - epsilon) * (log_normaliser - label_logit)
    if epsilon:
        others = logit_sum - label_logit - pad_logit  # sum of the other V - 2 logits
        loss -= epsilon / others_count * (others - others_count * log_normaliser)
    return loss


def projected_cross_entropy(labels, hidden, kernel, epsilon=0.1, pad_id=PAD_ID):
    """The smoothed cross-entropy of logits = hidden · kernelᵀ, with the output projection
    inside the gradient.

    Args:
      labels: [N] int target ids.
      hidden: [N, D] decoder states.
      kernel: [V, D] output projection (cast to float32).
      epsilon, pad_id: as for `label_smoothed_cross_entropy`.

    Returns:
      [N] float32 losses. Positions whose label is pad_id must get zero weight (multiply by
      the padding mask, as `masked_projected_loss_sum` does).

    Same value as projecting and calling label_smoothed_cross_entropy, in fewer passes over the
    [N, V] logits, which dominate a CPU step's element-wise work (CHANGELOG.md, "Measured
    gains of the speed-ups"):
    - sum_j z_j is hidden · (sum of kernel rows), not a pass over the logits;
    - of the gradient (softmax(z) - q) · upstream, only exp(z - c) becomes an [N, V] matrix
      (c: 0, or the row's max, `_softmax_statistics`; one cast to hidden's dtype): the row
      scale upstream / sum(exp) is applied on the [N, D] side, the uniform part of q
      (eps / (V - 2)) is a rank-1 term, and the label and pad columns, where q differs from
      it, are corrected exactly in float32 through rows of the kernel and of hidden.
    """
    vocab_size = tf.shape(kernel)[0]
    others_count = tf.cast(vocab_size, tf.float32) - 2.0
    off_value = epsilon / others_count  # q of every token but the label and pad

    @tf.custom_gradient
    def xent(hidden, kernel):
        weights = tf.cast(kernel, hidden.dtype)  # [V, D]
        logits = tf.cast(tf.matmul(hidden, weights, transpose_b=True), tf.float32)  # [N, V]
        shifted_exp, normaliser, log_normaliser = _softmax_statistics(logits)  # [N, (V)]
        label_logit = tf.gather(logits, labels, batch_dims=1)  # [N]
        hidden_32 = tf.cast(hidden, tf.float32)
        weights_32 = tf.cast(weights, tf.float32)  # [V, D], the values the logits used
        kernel_sum = tf.reduce_sum(weights_32, axis=0)  # [D]
        logit_sum = tf.linalg.matvec(hidden_32, kernel_sum)  # [N]
        loss = _smoothed_loss(log_normaliser, label_logit, logit_sum, logits[:, pad_id], epsilon,
                              others_count)

        def grad(upstream):  # upstream [N]
            scale = upstream / normaliser  # [N]
            # dlogits = (p - q) · upstream = scale · exp(z - c), minus the uniform
            # off_value · upstream (rank-1 terms), plus corrections in the label and pad
            # columns. Only exp(z - c) is written as an [N, V] matrix (in the compute dtype);
            # the row scale is applied to the [N, D] operands and results, and the two
            # corrections go to the gradients through the kernel's and hidden's rows, in
            # float32, so no pass scales or patches the [N, V] matrix.
            probs = tf.cast(shifted_exp, hidden.dtype)  # [N, V], unnormalised
            label_target = (tf.gather(shifted_exp, labels, batch_dims=1) * scale
                            - (1.0 - epsilon - off_value) * upstream)  # dlogits[n, y_n] + off·u
            pad_target = shifted_exp[:, pad_id] * scale + off_value * upstream
            # What the matrix already gives in those columns (its rounded entries, scaled).
            label_have = tf.cast(tf.gather(probs, labels, batch_dims=1), tf.float32) * scale
            pad_have = tf.cast(probs[:, pad_id], tf.float32) * scale
            label_fix = label_target - label_have  # [N]
            pad_fix = pad_target - pad_have  # [N]
            # Labels equal to pad occur only at padding, where upstream and both fixes are 0.
            uniform = off_value * upstream  # [N]: the off_value · upstream in every column
            dhidden = (tf.cast(tf.matmul(probs, weights), tf.float32) * scale[:, None]
                       - uniform[:, None] * kernel_sum[None, :]
                       + label_fix[:, None] * tf.gather(weights_32, labels)
                       + pad_fix[:, None] * weights_32[pad_id][None, :])  # [N, D]
            scaled_hidden = tf.cast(hidden_32 * scale[:, None], hidden.dtype)  # [N, D]
            fix_rows = tf.concat([label_fix[:, None] * hidden_32,  # [N + 1, D]
                                  tf.matmul(pad_fix[None, :], hidden_32)], 0)
            fix_ids = tf.concat([labels, [pad_id]], 0)  # [N + 1]
            dkernel = (tf.cast(tf.matmul(probs, scaled_hidden, transpose_a=True), tf.float32)
                       - tf.matmul(uniform[None, :], hidden_32)
                       + tf.math.unsorted_segment_sum(fix_rows, fix_ids, vocab_size))  # [V, D]
            return tf.cast(dhidden, hidden.dtype), dkernel  # [N, D], [V, D]

        return loss, grad

    return xent(hidden, tf.cast(kernel, tf.float32))


def masked_projected_loss_sum(labels, hidden, kernel, epsilon=0.1, pad_id=PAD_ID,
                              real_rows_only=True):
    """The training loop's loss: `masked_loss_sum` of the logits hidden · kernelᵀ, through
    `projected_cross_entropy`.

    Args:
      labels: [B, T] int target ids, pad_id at padding.
      hidden: [B, T, D] decoder states.
      kernel: [V, D] output projection.
      epsilon, pad_id: as for `label_smoothed_cross_entropy`.
      real_rows_only: project only the states whose label is not padding (a gather of a
        dynamic number of rows: the [N, V] logits, their two products and the softmax passes
        skip the batch's padding). False projects every row, with a static shape, for XLA.

    Returns:
      (sum of the smoothed loss, number of real target tokens), float32 scalars.
    """
    flat_labels = tf.reshape(labels, [-1])  # [N]
    flat_hidden = tf.reshape(hidden, [-1, hidden.shape[-1]])  # [N, D]
    real = tf.not_equal(flat_labels, pad_id)  # [N]
    weights = tf.cast(real, tf.float32)
    if real_rows_only:
        rows = tf.where(real)[:, 0]  # [R]
        loss = projected_cross_entropy(tf.gather(flat_labels, rows),
                                       tf.gather(flat_hidden, rows), kernel, epsilon, pad_id)
        return tf.reduce_sum(loss), tf.reduce_sum(weights)
    loss = projected_cross_entropy(flat_labels, flat_hidden, kernel, epsilon, pad_id)
    return tf.reduce_sum(loss * weights), tf.reduce_sum(weights)


def masked_loss_sum(labels, logits, epsilon=0.1, pad_id=PAD_ID):
    """The summed smoothed loss of a batch, for per-token means across batches and replicas.

    Args:
      labels: [B, T] int target ids, pad_id at padding.
      logits: [B, T, V].
      epsilon, pad_id: as for `label_smoothed_cross_entropy`.

    Returns:
      (sum of the smoothed loss, number of real target tokens), float32 scalars.
    """
    loss, weights = label_smoothed_cross_entropy(labels, logits, epsilon, pad_id)
    return tf.reduce_sum(loss), tf.reduce_sum(weights)


def masked_accuracy_sum(labels, logits, pad_id=PAD_ID):
    """Token accuracy counts of a batch.

    Args:
      labels: [B, T] int target ids, pad_id at padding.
      logits: [B, T, V].
      pad_id: the padding id.

    Returns:
      (number of real tokens whose argmax is the label, number of real tokens), float32.
    """
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    weights = tf.cast(tf.not_equal(labels, pad_id), tf.float32)
    correct = tf.cast(tf.equal(predictions, labels), tf.float32) * weights
    return tf.reduce_sum(correct), tf.reduce_sum(weights)


def label_smoothed_loss(labels, logits, epsilon=0.1, pad_id=PAD_ID):
    """The mean smoothed loss per real target token of one batch (single-device use).

    Args:
      labels: [B, T] int target ids, pad_id at padding.
      logits: [B, T, V].
      epsilon, pad_id: as for `label_smoothed_cross_entropy`.

    Returns:
      A float32 scalar.
    """
    total, count = masked_loss_sum(labels, logits, epsilon, pad_id)
    return total / tf.maximum(count, 1.0)
