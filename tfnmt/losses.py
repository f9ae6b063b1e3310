"""Label-smoothed, padding-masked cross-entropy (paper §5.4) and masked token accuracy.

Everything returns sums and counts rather than means: under tf.distribute each replica sees a
part of the batch, so the training loop divides the summed loss by the *global* number of real
target tokens (otherwise the loss is mis-scaled by the replica count and batch composition).
"""
import tensorflow as tf

from tfnmt.tokenizer import PAD_ID


def label_smoothed_cross_entropy(labels, logits, epsilon=0.1, pad_id=PAD_ID):
    """Per-token loss [B, T] (0 at padding) and weights [B, T] (1.0 at real tokens).

    The smoothed target q puts 1 - epsilon on the label and spreads epsilon evenly over the other
    V - 2 tokens, leaving none on padding, as the Annotated Transformer does:
        loss = -(1 - eps) log p(y) - eps / (V - 2) * sum_{j not in {y, pad}} log p(j)
    computed from logsumexp and the logits' sum, with the closed-form gradient softmax(z) - q
    (see _smoothed_xent).
    """
    logits = tf.cast(logits, tf.float32)
    weights = tf.cast(tf.not_equal(labels, pad_id), tf.float32)
    return _smoothed_xent(labels, logits, epsilon, pad_id) * weights, weights


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
        # logsumexp by hand, keeping exp(z - max) for the gradient (no second exp pass).
        row_max = tf.reduce_max(logits, axis=-1, keepdims=True)  # [B, T, 1]
        shifted_exp = tf.exp(logits - row_max)  # [B, T, V]
        normaliser = tf.reduce_sum(shifted_exp, axis=-1)  # [B, T]
        log_normaliser = tf.math.log(normaliser) + row_max[..., 0]
        label_logit = tf.gather(logits, labels, batch_dims=2)  # [B, T]
        loss = (1.0 - epsilon) * (log_normaliser - label_logit)
        if epsilon:
            others = tf.reduce_sum(logits, axis=-1) - label_logit - logits[..., pad_id]
            loss -= off_value * (others - others_count * log_normaliser)

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


def masked_loss_sum(labels, logits, epsilon=0.1, pad_id=PAD_ID):
    """(sum of the smoothed loss, number of real target tokens), both float32 scalars."""
    loss, weights = label_smoothed_cross_entropy(labels, logits, epsilon, pad_id)
    return tf.reduce_sum(loss), tf.reduce_sum(weights)


def masked_accuracy_sum(labels, logits, pad_id=PAD_ID):
    """(number of real tokens predicted exactly by argmax, number of real tokens)."""
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    weights = tf.cast(tf.not_equal(labels, pad_id), tf.float32)
    correct = tf.cast(tf.equal(predictions, labels), tf.float32) * weights
    return tf.reduce_sum(correct), tf.reduce_sum(weights)


def label_smoothed_loss(labels, logits, epsilon=0.1, pad_id=PAD_ID):
    """Mean smoothed loss per real target token of one (local) batch, for single-device use."""
    total, count = masked_loss_sum(labels, logits, epsilon, pad_id)
    return total / tf.maximum(count, 1.0)
