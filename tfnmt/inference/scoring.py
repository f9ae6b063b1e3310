"""Forced decoding: the model's log-probability of a given translation of a given source, for
filtering parallel data, reranking n-best lists and checking a reference against the model.

The score of a target sentence is log P(y | x) = sum over its subwords y_t and the final EOS of
log softmax(logits_t)[y_t], the decoder reading BOS y_1 .. y_{t-1} (teacher forcing); no length
penalty. Dividing by the length (subwords + EOS, also returned) gives a per-token score.
"""
import tensorflow as tf

from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID
from tfnmt.data.tokenizer import padded_with_ends


def target_arrays(token_ids, max_length):
    """Decoder input and output ids of tokenized target sentences.

    Args:
      token_ids: ragged subword ids [B, None].
      max_length: the longest decoder sequence (the model's max_length): targets are cut to
        max_length - 1 subwords.

    Returns:
      (target_in [B, T]: BOS then the subwords; target_out [B, T]: the subwords then EOS), both
      int32 and PAD-padded.
    """
    token_ids = token_ids[:, : max_length - 1]
    return (padded_with_ends(token_ids, start_id=BOS_ID),
            padded_with_ends(token_ids, end_id=EOS_ID))


def sequence_log_probs(model, source_ids, target_in, target_out):
    """Each target's log-probability under the model, by teacher forcing.

    Args:
      model: a `Transformer`.
      source_ids: [B, S] int32, PAD-padded, EOS-terminated.
      target_in, target_out: [B, T] int32 (`target_arrays`).

    Returns:
      (log-probabilities [B] float32, lengths [B] int32: subwords + EOS scored).
    """
    logits = tf.cast(model((source_ids, target_in), training=False), tf.float32)  # [B, T, V]
    log_probs = tf.nn.log_softmax(logits)
    picked = tf.gather(log_probs, target_out, batch_dims=2)  # [B, T]
    real = tf.not_equal(target_out, PAD_ID)
    return (tf.reduce_sum(tf.where(real, picked, 0.0), axis=1),
            tf.reduce_sum(tf.cast(real, tf.int32), axis=1))
