"""Greedy decoding, incremental and by full recomputation (the reference the cached decoders
are checked against), and what both searches share: the exact top-k of log-probabilities,
shape invariants, row replacement."""
import tensorflow as tf

from tfnmt import kv_cache
from tfnmt.tokenizer import BOS_ID, EOS_ID, PAD_ID

EXTRA_LENGTH = 50  # outputs may be this much longer than their source (paper §6.1)


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


def decode_limits(model, source_ids, max_length=None, extra=EXTRA_LENGTH):
    """Each sentence's output limit, int32 [B]: its own source length (EOS included) + `extra`
    (paper §6.1: input + 50), or `max_length` (a scalar or [B]) where given, at least 1 and
    never past the model's table of learned positions. Per sentence, so that a sentence's
    output does not depend on the other sentences of its batch."""
    batch = tf.shape(source_ids)[0]
    if max_length is None:
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
        limits = lengths + extra
    else:
        limits = tf.broadcast_to(tf.cast(max_length, tf.int32), [batch])
    if model.settings["position"] == "learned":  # step t embeds position t
        limits = tf.minimum(limits, model.settings["max_length"])
    return tf.maximum(limits, 1)


def top_log_probs(logits, count, width=32):
    """logits [R, V] float32 -> (log-probabilities [R, count], token ids [R, count]): each
    row's `count` most likely tokens, best first, ties to the lower id: what
    top_k(log_softmax(logits), count) gives, without a log-softmax or a top-k over all V.

    On CPU both passes over [R, V] are slow (they were 2.2 ms of a 13-ms beam step). Here each
    row's logits are cut into chunks of `width` consecutive tokens (the last padded with -inf)
    and one max per chunk is taken. The `count` chunks with the largest maxima hold the row's
    `count` best tokens (a chunk holding one of them has a maximum at least the count-th best
    value, and at most `count` chunks do), so the top-k runs over count * width candidates.
    The log-normaliser comes from one softmax (a fused oneDNN kernel): log p = (x - max) +
    log softmax(x)[argmax], where softmax(x)[argmax] >= 1 / V never underflows.
    """
    vocab = logits.shape[-1]
    chunks = -(-vocab // width)  # ceil
    padded = logits
    if chunks * width != vocab:
        padded = tf.pad(logits, [[0, 0], [0, chunks * width - vocab]],
                        constant_values=float("-inf"))
    rows = tf.shape(logits)[0]
    count = min(count, vocab)
    padded = tf.reshape(padded, [rows, chunks, width])  # token = chunk * width + offset
    _, best_chunks = tf.math.top_k(tf.reduce_max(padded, axis=2), k=min(count, chunks))
    best_chunks = tf.sort(best_chunks, axis=1)  # so that candidates run in token order
    candidates = tf.gather(padded, best_chunks, batch_dims=1)  # [R, count, width]
    candidate_ids = best_chunks[:, :, None] * width + tf.range(width)
    top_logits, position = tf.math.top_k(tf.reshape(candidates, [rows, -1]), k=count)
    ids = tf.gather(tf.reshape(candidate_ids, [rows, -1]), position, batch_dims=1)
    max_probs = tf.gather(tf.nn.softmax(logits), ids[:, :1], batch_dims=1)  # [R, 1]
    return top_logits - top_logits[:, :1] + tf.math.log(max_probs), ids


def _memory_invariants(cache):
    """tf.while_loop shape invariants of the memory keys/values of a model's initial_cache:
    sentences may leave (axis 0); the rest of the shape stays."""
    return [{name: tf.TensorShape([None] + t.shape[1:].as_list())
             for name, t in layer["memory"].items()} for layer in cache]


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
    (a finished sentence leaves the batch). A sentence stops at EOS or at its limit
    (`decode_limits`: its source length + 50 unless `max_length`, a scalar or [B], is given).
    Works eagerly and inside tf.function."""
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    memory, source_padding = model.encode(source_ids, training=False)
    batch = tf.shape(source_ids)[0]
    limits = decode_limits(model, source_ids, max_length)  # [B]
    max_length = tf.reduce_max(tf.concat([limits, [0]], 0))
    initial_cache = model.initial_cache(memory)
    # Self-attention keys/values in stores written in place (kv_cache.py), slot b for
    # sentence b; memory keys/values [A, H, S, Dh] for the sentences still decoding.
    heads, stores = kv_cache.empty_stores(initial_cache)
    memory_cache = [c["memory"] for c in initial_cache]
    outputs = tf.TensorArray(tf.int32, size=0, dynamic_size=True)
    attention = tf.TensorArray(tf.float32, size=0, dynamic_size=True)

    def keep_going(step, active, *_):  # each sentence leaves at EOS or at its limit
        return tf.size(active) > 0

    def one_step(step, active, tokens, scores, stores, memory_cache, source_padding, outputs,
                 attention):
        # active [A]: the sentences still decoding; tokens, memory_cache and source_padding
        # are theirs.
        rows = kv_cache.step_rows(step, batch, heads, active,
                                  tf.tile(active[:, None], [1, step]))
        stores = kv_cache.grow(stores, step, batch, heads, max_length)
        cache = [{"self": dict(s, **rows), "memory": m} for s, m in zip(stores, memory_cache)]
        result = model.decode_step(tokens[:, None], step, cache, source_padding,
                                   return_attention=return_attention)
        logits, cache = result[:2]
        stores = [c["self"] for c in cache]
        if return_attention:
            attention = attention.write(step, replace_rows(
                tf.zeros([batch, tf.shape(source_ids)[1]]), active, result[2]))
        best_log_probs, best_tokens = top_log_probs(logits, 1)  # [A, 1]
        next_tokens = best_tokens[:, 0]
        scores = tf.tensor_scatter_nd_add(scores, active[:, None], best_log_probs[:, 0])
        outputs = outputs.write(step, replace_rows(tf.fill([batch], PAD_ID), active,
                                                   next_tokens))
        staying = tf.cast(tf.where(tf.not_equal(next_tokens, eos_id)
                                   & (step + 1 < tf.gather(limits, active)))[:, 0], tf.int32)
        memory_cache, source_padding = tf.cond(
            tf.size(staying) < tf.size(active),
            lambda: tf.nest.map_structure(lambda t: tf.gather(t, staying),
                                          (memory_cache, source_padding)),
            lambda: (memory_cache, source_padding))
        return (step + 1, tf.gather(active, staying), tf.gather(next_tokens, staying), scores,
                stores, memory_cache, source_padding, outputs, attention)

    loop_vars = (tf.constant(0), tf.range(batch), tf.fill([batch], bos_id),
                 tf.zeros([batch], tf.float32), stores, memory_cache, source_padding, outputs,
                 attention)
    invariants = (tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None]),
                  tf.TensorShape([None]), kv_cache.store_invariants(stores),
                  _memory_invariants(initial_cache),
                  tf.TensorShape([None, None]), tf.TensorShape(None), tf.TensorShape(None))
    _, _, _, scores, _, _, _, outputs, attention = tf.while_loop(
        keep_going, one_step, loop_vars, shape_invariants=invariants)
    ids = tf.cond(outputs.size() > 0, lambda: tf.transpose(outputs.stack()),
                  lambda: tf.zeros([batch, 0], tf.int32))
    if return_attention:
        weights = tf.cond(attention.size() > 0,
                          lambda: tf.transpose(attention.stack(), [1, 0, 2]),
                          lambda: tf.zeros([batch, 0, tf.shape(source_ids)[1]]))
        return ids, scores, weights
    return ids, scores
