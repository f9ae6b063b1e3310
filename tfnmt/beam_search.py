"""Batched beam search with a GNMT length penalty, in pure TensorFlow (tf.while_loop; no
py_function, no TF Addons ops), so that it runs inside a SavedModel under TF Serving.

Hypotheses are scored as log P(y | x) / lp(|y|), lp(n) = ((5 + n) / 6)^alpha (Wu et al., 2016),
where |y| counts the generated tokens including EOS. Search stops when no unfinished hypothesis
can still beat the k-th finished one of its sentence (or at max_length).
"""
import tensorflow as tf

from tfnmt.decoding import _cache_invariants, default_max_length, replace_rows
from tfnmt.tokenizer import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1e9


def length_penalty(length, alpha):
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _merge_beams(x):
    """[B, K, ...] -> [B*K, ...]"""
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def _split_beams(x, beam_size):
    """[B*K, ...] -> [B, K, ...]"""
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] // beam_size, beam_size], shape[1:]], 0))


def _gather_beams(x, indices):
    """x [B, K, ...] (or a nest of [B*K, ...] cache tensors), indices [B, K'] -> [B, K', ...]"""
    return tf.gather(x, indices, batch_dims=1)


def beam_search(model, source_ids, beam_size=4, alpha=0.6, max_length=None, n_best=1,
                return_attention=False):
    """source_ids [B, S] int32 -> (ids [B, N, L] without BOS, PAD after EOS; scores [B, N];
    with return_attention, the last decoder layer's cross-attention averaged over heads
    [B, N, L, S]), N = n_best <= beam_size, best first. max_length defaults to the longest
    source + 50.

    A sentence leaves the search as soon as none of its alive hypotheses can beat its k-th
    finished one (that bound only tightens, so its result is final): the decoder then runs on
    the remaining sentences only. The results are those of searching every sentence to the end.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    k = beam_size
    if max_length is None:
        max_length = default_max_length(source_ids)
    max_length = tf.convert_to_tensor(max_length, tf.int32)
    best_penalty = length_penalty(max_length, alpha)  # the largest an alive one can still get
    memory, source_padding = model.encode(source_ids, training=False)
    # The self-attention cache has a row per hypothesis [B*K, ...]; the encoder's keys/values
    # and source padding one per sentence ([B, ...]; its k beams query it together).
    cache = [{"self": tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), c["self"]),
              "memory": c["memory"]} for c in model.initial_cache(memory)]
    vocab_size = model.settings["target_vocab_size"]

    # Sentences still searched ("active", A of them, by index into the batch) carry their alive
    # hypotheses, decoder cache and source padding; finished hypotheses are kept for all B.
    active = tf.range(batch)  # [A]
    # Only beam 0 is live at first, so the first step does not pick k copies.
    alive_seq = tf.zeros([batch, k, 0], tf.int32)  # [A, K, t]
    alive_log_probs = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1])  # [A, K]
    finished_seq = tf.zeros([batch, k, 0], tf.int32)  # [B, K, t]
    finished_scores = tf.fill([batch, k], NEG_INF)  # [B, K]
    last_tokens = tf.fill([batch * k], BOS_ID)  # [A*K]
    # Attention rows follow their hypotheses; without return_attention they are [.., 0] wide.
    attention_width = tf.shape(source_ids)[1] if return_attention else 0
    alive_attn = tf.zeros([batch, k, 0, attention_width])  # [A, K, t, W]
    finished_attn = alive_attn  # [B, K, t, W]

    def pad_time(seq, length):
        padding = [[0, 0], [0, 0], [0, length - tf.shape(seq)[2]]] + [[0, 0]] * (seq.shape.rank - 3)
        return tf.pad(seq, padding, constant_values=PAD_ID if seq.dtype == tf.int32 else 0)

    def not_done(step, active, *_):
        return tf.logical_and(step < max_length, tf.size(active) > 0)

    def step_fn(step, active, alive_seq, alive_log_probs, finished_seq, finished_scores,
                last_tokens, cache, source_padding, alive_attn, finished_attn):
        active_count = tf.shape(active)[0]
        result = model.decode_step(last_tokens[:, None], step, cache, source_padding,
                                   return_attention=return_attention)
        logits, cache = result[:2]
        step_attn = (_split_beams(result[2], k) if return_attention
                     else tf.zeros([active_count, k, 0]))  # [A, K, S]
        log_probs = _split_beams(tf.nn.log_softmax(logits), k)  # [A, K, V]
        candidates = alive_log_probs[:, :, None] + log_probs  # [A, K, V]
        flat = tf.reshape(candidates, [active_count, k * vocab_size])
        # 2k candidates: even if k of them end in EOS, k remain to continue.
        top_log_probs, top_index = tf.math.top_k(flat, k=2 * k)  # [A, 2K]
        top_beam = top_index // vocab_size
        top_token = top_index % vocab_size
        top_seq = tf.concat([_gather_beams(alive_seq, top_beam), top_token[:, :, None]], axis=2)
        top_attn = tf.concat([_gather_beams(alive_attn, top_beam),
                              _gather_beams(step_attn, top_beam)[:, :, None]], axis=2)
        ends = tf.equal(top_token, EOS_ID)

        # Finished: the k best of those finished before and those ending now.
        length = step + 1
        ended_scores = top_log_probs / length_penalty(length, alpha)
        ended_scores += tf.cast(tf.logical_not(ends), tf.float32) * NEG_INF
        all_seq = tf.concat([pad_time(tf.gather(finished_seq, active), length), top_seq], 1)
        all_scores = tf.concat([tf.gather(finished_scores, active), ended_scores], axis=1)
        all_attn = tf.concat([pad_time(tf.gather(finished_attn, active), length), top_attn], 1)
        active_finished_scores, best = tf.math.top_k(all_scores, k=k)  # [A, K]
        finished_scores = replace_rows(finished_scores, active, active_finished_scores)
        finished_seq = replace_rows(pad_time(finished_seq, length), active,
                                     _gather_beams(all_seq, best))
        finished_attn = replace_rows(pad_time(finished_attn, length), active,
                                      _gather_beams(all_attn, best))

        # Continue with the k best that did not end.
        continue_scores = top_log_probs + tf.cast(ends, tf.float32) * NEG_INF
        continue_scores, keep = tf.math.top_k(continue_scores, k=k)  # [A, K]
        source_beam = _gather_beams(top_beam, keep)  # which old beam each new one extends

        # A sentence stays while its best alive hypothesis, under the largest length penalty
        # it can still reach, beats its k-th finished one (log-probs only fall from here).
        can_improve = continue_scores[:, 0] / best_penalty > active_finished_scores[:, -1]
        staying = tf.cast(tf.where(can_improve)[:, 0], tf.int32)  # [A'] positions in active
        alive_seq = tf.gather(_gather_beams(top_seq, keep), staying)  # [A', K, t+1]
        alive_attn = tf.gather(_gather_beams(top_attn, keep), staying)
        # Self-attention cache rows: the old beam each new hypothesis extends, in the staying
        # sentences. The encoder side is copied only when sentences leave.
        beam_rows = tf.gather(source_beam + tf.range(active_count)[:, None] * k, staying)
        self_cache = [tf.nest.map_structure(lambda t: tf.gather(t, tf.reshape(beam_rows, [-1])),
                                            c["self"]) for c in cache]
        memory_cache, source_padding = tf.cond(
            tf.size(staying) < active_count,
            lambda: tf.nest.map_structure(lambda t: tf.gather(t, staying),
                                          ([c["memory"] for c in cache], source_padding)),
            lambda: ([c["memory"] for c in cache], source_padding))
        cache = [{"self": s, "memory": m} for s, m in zip(self_cache, memory_cache)]
        return (step + 1, tf.gather(active, staying), alive_seq,
                tf.gather(continue_scores, staying), finished_seq, finished_scores,
                tf.reshape(alive_seq[:, :, -1], [-1]), cache, source_padding, alive_attn,
                finished_attn)

    loop_vars = (tf.constant(0), active, alive_seq, alive_log_probs, finished_seq,
                 finished_scores, last_tokens, cache, source_padding, alive_attn, finished_attn)
    attn_shape = tf.TensorShape([None, k, None, None])
    invariants = (tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None, k, None]),
                  tf.TensorShape([None, k]), tf.TensorShape([None, k, None]),
                  tf.TensorShape([None, k]), tf.TensorShape([None]), _cache_invariants(cache),
                  tf.TensorShape([None, None]), attn_shape, attn_shape)
    (step, active, alive_seq, alive_log_probs, finished_seq, finished_scores, _, _, _,
     alive_attn, finished_attn) = tf.while_loop(not_done, step_fn, loop_vars,
                                                shape_invariants=invariants)

    # Sentences still searched at max_length are completed with their alive hypotheses, scored
    # by the same length penalty (for the others no alive one can beat their k finished ones).
    alive_scores = tf.where(alive_log_probs > NEG_INF / 2,
                            alive_log_probs / length_penalty(step, alpha), NEG_INF)
    all_scores = tf.concat([finished_scores, replace_rows(
        tf.fill([batch, k], NEG_INF), active, alive_scores)], axis=1)  # [B, 2K]
    scores, best = tf.math.top_k(all_scores, k=n_best)

    def with_alive(finished, alive):  # [B, K, L, ...] finished and active alive ones
        everyone = tf.zeros(tf.concat([[batch], tf.shape(alive)[1:]], 0), alive.dtype)
        return _gather_beams(tf.concat([pad_time(finished, step),
                                        replace_rows(everyone, active, alive)], axis=1), best)

    if return_attention:
        return with_alive(finished_seq, alive_seq), scores, with_alive(finished_attn, alive_attn)
    return with_alive(finished_seq, alive_seq), scores
