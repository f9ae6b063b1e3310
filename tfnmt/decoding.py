"""Greedy decoding by full recomputation (the reference the cached decoders are checked against)."""
import tensorflow as tf

from tfnmt.tokenizer import BOS_ID, EOS_ID, PAD_ID


def greedy_decode_uncached(model, source_ids, max_length, bos_id=BOS_ID, eos_id=EOS_ID):
    """source_ids [B, S] -> output ids [B, <= max_length] without BOS; after EOS, PAD.

    Re-runs the decoder over the whole prefix at each step (O(T^2) work): simple and obviously
    right, used in tests and as the baseline of the incremental decoders.
    """
    source_ids = tf.convert_to_tensor(source_ids)
    memory, source_padding = model.encode(source_ids, training=False)
    batch = tf.shape(source_ids)[0]
    prefix = tf.fill([batch, 1], tf.constant(bos_id, source_ids.dtype))
    finished = tf.zeros([batch], tf.bool)
    for _ in range(max_length):
        logits = model.decode(prefix, memory, source_padding, training=False)  # [B, T, V]
        next_ids = tf.argmax(logits[:, -1], axis=-1, output_type=source_ids.dtype)
        next_ids = tf.where(finished, tf.constant(PAD_ID, source_ids.dtype), next_ids)
        prefix = tf.concat([prefix, next_ids[:, None]], axis=1)
        finished |= tf.equal(next_ids, eos_id)
        if bool(tf.reduce_all(finished)):
            break
    return prefix[:, 1:]
