"""Label-smoothed, padding-masked cross-entropy (paper §5.4) and masked token accuracy.

Everything returns sums and counts rather than means: under tf.distribute each replica sees a
part of the batch, so the training loop divides the summed loss by the *global* number of real
target tokens (otherwise the loss is mis-scaled by the replica count and batch composition).
"""
import tensorflow as tf

from tfnmt.tokenizer import PAD_ID


def label_smoothed_cross_entropy(labels, logits, epsilon=0.1, pad_id=PAD_ID):
    """Per-token loss [B, T] (0 at padding) and weights [B, T] (1.0 at real tokens).

    The smoothed target puts 1 - epsilon on the label and spreads epsilon evenly over the other
    V - 2 tokens, leaving none on padding, as the Annotated Transformer does:
        loss = -(1 - eps) log p(y) - eps / (V - 2) * sum_{j not in {y, pad}} log p(j)
    """
    logits = tf.cast(logits, tf.float32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)  # [B, T, V]
    vocab_size = tf.cast(tf.shape(logits)[-1], tf.float32)
    label_log_prob = tf.gather(log_probs, labels, batch_dims=2)  # [B, T]
    loss = -(1.0 - epsilon) * label_log_prob
    if epsilon:
        others = tf.reduce_sum(log_probs, axis=-1) - label_log_prob - log_probs[..., pad_id]
        loss -= epsilon / (vocab_size - 2.0) * others
    weights = tf.cast(tf.not_equal(labels, pad_id), tf.float32)
    return loss * weights, weights


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
