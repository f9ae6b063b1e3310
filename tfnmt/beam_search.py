"""Batched beam search with a GNMT length penalty, in pure TensorFlow (tf.while_loop; no
py_function, no TF Addons ops), so that it runs inside a SavedModel under TF Serving.

Hypotheses are scored as log P(y | x) / lp(|y|), lp(n) = ((5 + n) / 6)^alpha (Wu et al., 2016),
where |y| counts the generated tokens including EOS. A sentence's search stops when none of
its unfinished hypotheses can still beat its k-th finished one (or at max_length); it then
leaves the batch, so the decoder runs on fewer rows while the others go on.
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
    initial_cache = model.initial_cache(memory)
    vocab_size = model.settings["target_vocab_size"]
    # Attention rows follow their hypotheses; without return_attention they are [.., 0] wide.
    attention_width = tf.shape(source_ids)[1] if return_attention else 0

    # The sentences still searched (A of them): their index in the batch, hypotheses, source
    # padding and encoder keys/values, all [A, ...] (a sentence's k beams query its encoder
    # keys/values together). Only beam 0 is live at first, so the first step does not pick k
    # copies.
    sentences = {
        "index": tf.range(batch),  # [A]
        "alive_seq": tf.zeros([batch, k, 0], tf.int32),  # [A, K, t]
        "alive_log_probs": tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1]),
        "alive_attn": tf.zeros([batch, k, 0, attention_width]),  # [A, K, t, W]
        "finished_seq": tf.zeros([batch, k, 0], tf.int32),  # [A, K, t]
        "finished_scores": tf.fill([batch, k], NEG_INF),  # [A, K]
        "finished_attn": tf.zeros([batch, k, 0, attention_width]),
        "source_padding": source_padding,  # [A, S]
        "memory": [c["memory"] for c in initial_cache],  # per layer {key, value} [A, H, S, Dh]
    }
    # Self-attention keys/values: a row per hypothesis, [A*K, H, t, Dh] per layer.
    self_cache = [tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), c["self"])
                  for c in initial_cache]
    last_tokens = tf.fill([batch * k], BOS_ID)  # [A*K]
    # The k finished hypotheses of the sentences that left, [B, K, ...] (rows of the others
    # are filled when they leave or at the end).
    results = {"seq": tf.zeros([batch, k, 0], tf.int32), "scores": tf.fill([batch, k], NEG_INF),
               "attn": tf.zeros([batch, k, 0, attention_width])}

    def pad_time(seq, length):
        padding = [[0, 0], [0, 0], [0, length - tf.shape(seq)[2]]] + [[0, 0]] * (seq.shape.rank - 3)
        return tf.pad(seq, padding, constant_values=PAD_ID if seq.dtype == tf.int32 else 0)

    def store(results, sentences, length):
        """results with the rows of `sentences` replaced by their finished hypotheses."""
        index = sentences["index"]
        return {"seq": replace_rows(pad_time(results["seq"], length), index,
                                    sentences["finished_seq"]),
                "scores": replace_rows(results["scores"], index, sentences["finished_scores"]),
                "attn": replace_rows(pad_time(results["attn"], length), index,
                                     sentences["finished_attn"])}

    def not_done(step, sentences, *_):
        return tf.logical_and(step < max_length, tf.size(sentences["index"]) > 0)

    def step_fn(step, sentences, self_cache, last_tokens, results):
        active_count = tf.shape(sentences["index"])[0]
        cache = [{"self": s, "memory": m} for s, m in zip(self_cache, sentences["memory"])]
        result = model.decode_step(last_tokens[:, None], step, cache,
                                   sentences["source_padding"], return_attention=return_attention)
        logits, cache = result[:2]
        step_attn = (_split_beams(result[2], k) if return_attention
                     else tf.zeros([active_count, k, 0]))  # [A, K, S]
        log_probs = _split_beams(tf.nn.log_softmax(logits), k)  # [A, K, V]
        candidates = sentences["alive_log_probs"][:, :, None] + log_probs  # [A, K, V]
        flat = tf.reshape(candidates, [active_count, k * vocab_size])
        # 2k candidates: even if k of them end in EOS, k remain to continue.
        top_log_probs, top_index = tf.math.top_k(flat, k=2 * k)  # [A, 2K]
        top_beam = top_index // vocab_size
        top_token = top_index % vocab_size
        top_seq = tf.concat([_gather_beams(sentences["alive_seq"], top_beam),
                             top_token[:, :, None]], axis=2)
        top_attn = tf.concat([_gather_beams(sentences["alive_attn"], top_beam),
                              _gather_beams(step_attn, top_beam)[:, :, None]], axis=2)
        ends = tf.equal(top_token, EOS_ID)

        # Continue with the k best that did not end.
        continue_scores = top_log_probs + tf.cast(ends, tf.float32) * NEG_INF
        continue_scores, keep = tf.math.top_k(continue_scores, k=k)  # [A, K]
        source_beam = _gather_beams(top_beam, keep)  # which old beam each new one extends

        # Finished: the k best of those finished before and those ending now.
        length = step + 1
        ended_scores = top_log_probs / length_penalty(length, alpha)
        ended_scores += tf.cast(tf.logical_not(ends), tf.float32) * NEG_INF
        all_seq = tf.concat([pad_time(sentences["finished_seq"], length), top_seq], axis=1)
        all_scores = tf.concat([sentences["finished_scores"], ended_scores], axis=1)
        all_attn = tf.concat([pad_time(sentences["finished_attn"], length), top_attn], axis=1)
        finished_scores, best = tf.math.top_k(all_scores, k=k)  # [A, K]
        sentences = dict(sentences, alive_seq=_gather_beams(top_seq, keep),
                         alive_log_probs=continue_scores,
                         alive_attn=_gather_beams(top_attn, keep),
                         finished_seq=_gather_beams(all_seq, best),
                         finished_scores=finished_scores,
                         finished_attn=_gather_beams(all_attn, best))

        # A sentence stays while its best alive hypothesis, under the largest length penalty
        # it can still reach, beats its k-th finished one (log-probs only fall from here).
        staying = continue_scores[:, 0] / best_penalty > finished_scores[:, -1]  # [A]
        staying_index = tf.cast(tf.where(staying)[:, 0], tf.int32)  # [A']
        # Self-attention cache rows: the old beam each new hypothesis extends, in the staying
        # sentences (the reordering every step needs anyway).
        beam_rows = tf.gather(source_beam + tf.range(active_count)[:, None] * k, staying_index)
        self_cache = [tf.nest.map_structure(lambda t: tf.gather(t, tf.reshape(beam_rows, [-1])),
                                            c["self"]) for c in cache]

        def some_leave():  # store their results; the others' state shrinks to them
            leaving = tf.cast(tf.where(tf.logical_not(staying))[:, 0], tf.int32)
            left = tf.nest.map_structure(lambda t: tf.gather(t, leaving), sentences)
            return (store(results, left, length),
                    tf.nest.map_structure(lambda t: tf.gather(t, staying_index), sentences))

        results, sentences = tf.cond(tf.reduce_all(staying), lambda: (results, sentences),
                                     some_leave)
        last_tokens = tf.reshape(sentences["alive_seq"][:, :, -1], [-1])
        return step + 1, sentences, self_cache, last_tokens, results

    attn_shape = tf.TensorShape([None, k, None, None])
    seq_shape, scores_shape = tf.TensorShape([None, k, None]), tf.TensorShape([None, k])
    invariants = (
        tf.TensorShape([]),
        {"index": tf.TensorShape([None]), "alive_seq": seq_shape, "alive_log_probs": scores_shape,
         "alive_attn": attn_shape, "finished_seq": seq_shape, "finished_scores": scores_shape,
         "finished_attn": attn_shape, "source_padding": tf.TensorShape([None, None]),
         "memory": [c["memory"] for c in _cache_invariants(initial_cache)]},
        [c["self"] for c in _cache_invariants(initial_cache)], tf.TensorShape([None]),
        {"seq": seq_shape, "scores": scores_shape, "attn": attn_shape})
    step, sentences, _, _, results = tf.while_loop(
        not_done, step_fn, (tf.constant(0), sentences, self_cache, last_tokens, results),
        shape_invariants=invariants)

    # Sentences still searched at max_length are completed with their alive hypotheses, scored
    # by the same length penalty (for the others no alive one can beat their k finished ones).
    alive_scores = tf.where(sentences["alive_log_probs"] > NEG_INF / 2,
                            sentences["alive_log_probs"] / length_penalty(step, alpha), NEG_INF)
    all_scores = tf.concat([sentences["finished_scores"], alive_scores], axis=1)  # [A, 2K]
    finished_scores, best = tf.math.top_k(all_scores, k=k)
    completed = dict(sentences, finished_scores=finished_scores, finished_seq=_gather_beams(
        tf.concat([pad_time(sentences["finished_seq"], step), sentences["alive_seq"]], 1), best),
        finished_attn=_gather_beams(tf.concat([pad_time(sentences["finished_attn"], step),
                                               sentences["alive_attn"]], 1), best))
    results = store(results, completed, step)  # [B, K, ...], each sentence's best first
    if return_attention:
        return results["seq"][:, :n_best], results["scores"][:, :n_best], \
            results["attn"][:, :n_best]
    return results["seq"][:, :n_best], results["scores"][:, :n_best]
