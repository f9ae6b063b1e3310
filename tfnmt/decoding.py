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


def default_max_length(source_ids, extra=50, pad_id=PAD_ID):
    """Paper §6.1: maximum output length = input length + 50 (longest source in the batch)."""
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, pad_id), tf.int32), axis=1)
    return tf.reduce_max(lengths) + extra


def _cache_invariants(cache):
    """Self-attention caches grow along time (axis 2); memory caches keep their shape."""
    def growing(t):
        return tf.TensorShape([None, t.shape[1], None, t.shape[3]])

    def fixed(t):
        return tf.TensorShape([None] + t.shape[1:].as_list())

    return [{"self": {name: growing(t) for name, t in layer["self"].items()},
             "memory": {name: fixed(t) for name, t in layer["memory"].items()}}
            for layer in cache]


def replace_rows(full, rows, updates):
    """full [B, ...] with the rows `rows` [A] replaced by updates [A, ...]. A gather, since
    TensorScatterUpdate refuses tensors with an empty dimension (such as zero time steps)."""
    batch = tf.shape(full)[0]
    selector = tf.tensor_scatter_nd_update(tf.range(batch), rows[:, None],
                                           batch + tf.range(tf.shape(rows)[0]))
    return tf.gather(tf.concat([full, updates], axis=0), selector)


def greedy_decode(model, source_ids, max_length=None, bos_id=BOS_ID, eos_id=EOS_ID,
                  return_attention=False):
    """Incremental greedy decoding: source_ids [B, S] -> (ids [B, L] without BOS, PAD after EOS;
    log-probabilities [B] of the output, EOS included; with return_attention, the last
    decoder layer's cross-attention averaged over heads [B, L, S]). Decoder self-attention
    keys/values are cached per layer and the encoder's keys/values are projected once; each
    step runs the decoder on one position, for the sentences that have not produced EOS yet
    (a finished sentence leaves the batch). Stops when every sentence has produced EOS, or at
    `max_length` (default: longest source + 50). Works eagerly and inside tf.function."""
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    memory, source_padding = model.encode(source_ids, training=False)
    batch = tf.shape(source_ids)[0]
    if max_length is None:
        max_length = default_max_length(source_ids)
    cache = model.initial_cache(memory)
    outputs = tf.TensorArray(tf.int32, size=0, dynamic_size=True)
    attention = tf.TensorArray(tf.float32, size=0, dynamic_size=True)

    def keep_going(step, active, *_):
        return tf.logical_and(step < max_length, tf.size(active) > 0)

    def one_step(step, active, tokens, scores, cache, source_padding, outputs, attention):
        # active [A]: the sentences still decoding; tokens, cache and source_padding are theirs.
        result = model.decode_step(tokens[:, None], step, cache, source_padding,
                                   return_attention=return_attention)
        logits, cache = result[:2]
        if return_attention:
            attention = attention.write(step, replace_rows(
                tf.zeros([batch, tf.shape(source_ids)[1]]), active, result[2]))
        log_probs = tf.nn.log_softmax(logits)  # [A, V]
        next_tokens = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        scores = tf.tensor_scatter_nd_add(scores, active[:, None],
                                          tf.reduce_max(log_probs, axis=-1))
        outputs = outputs.write(step, replace_rows(tf.fill([batch], PAD_ID), active,
                                                   next_tokens))
        staying = tf.cast(tf.where(tf.not_equal(next_tokens, eos_id))[:, 0], tf.int32)
        cache, source_padding = tf.cond(
            tf.size(staying) < tf.size(active),
            lambda: tf.nest.map_structure(lambda t: tf.gather(t, staying),
                                          (cache, source_padding)),
            lambda: (cache, source_padding))
        return (step + 1, tf.gather(active, staying), tf.gather(next_tokens, staying), scores,
                cache, source_padding, outputs, attention)

    loop_vars = (tf.constant(0), tf.range(batch), tf.fill([batch], bos_id),
                 tf.zeros([batch], tf.float32), cache, source_padding, outputs, attention)
    invariants = (tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None]),
                  tf.TensorShape([None]), _cache_invariants(cache), tf.TensorShape([None, None]),
                  tf.TensorShape(None), tf.TensorShape(None))
    _, _, _, scores, _, _, outputs, attention = tf.while_loop(keep_going, one_step, loop_vars,
                                                              shape_invariants=invariants)
    ids = tf.cond(outputs.size() > 0, lambda: tf.transpose(outputs.stack()),
                  lambda: tf.zeros([batch, 0], tf.int32))
    if return_attention:
        weights = tf.cond(attention.size() > 0,
                          lambda: tf.transpose(attention.stack(), [1, 0, 2]),
                          lambda: tf.zeros([batch, 0, tf.shape(source_ids)[1]]))
        return ids, scores, weights
    return ids, scores
