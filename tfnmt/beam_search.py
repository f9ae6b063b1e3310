"""Batched beam search with a GNMT length penalty, in pure TensorFlow (tf.while_loop; no
py_function, no TF Addons ops), so that it runs inside a SavedModel under TF Serving.

Hypotheses are scored as log P(y | x) / lp(|y|), lp(n) = ((5 + n) / 6)^alpha (Wu et al., 2016),
where |y| counts the generated tokens including EOS. A sentence's search stops when none of
its unfinished hypotheses can still beat its k-th finished one, or at its own length limit; it
then leaves the batch, so the decoder runs on fewer rows while the others go on. Nothing of a
sentence's search depends on the other sentences of its batch.
"""
import tensorflow as tf

from tfnmt import kv_cache
from tfnmt.decoding import _memory_invariants, decode_limits, replace_rows, top_log_probs
from tfnmt.tokenizer import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1e9


def length_penalty(length, alpha):
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _split_beams(x, beam_size):
    """[B*K, ...] -> [B, K, ...]"""
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] // beam_size, beam_size], shape[1:]], 0))


def _gather_beams(x, indices):
    """x [B, K, ...], indices [B, K'] -> [B, K', ...]"""
    return tf.gather(x, indices, batch_dims=1)


def beam_search(model, source_ids, beam_size=4, alpha=0.6, max_length=None, n_best=1,
                return_attention=False):
    """source_ids [B, S] int32 -> (ids [B, N, L] without BOS, PAD after EOS; scores [B, N];
    with return_attention, the last decoder layer's cross-attention averaged over heads
    [B, N, L, S]), N = n_best <= beam_size, best first. Each sentence's output is at most its
    own source length + 50 subwords, or `max_length` (a scalar or [B]) where given
    (`decoding.decode_limits`).

    A sentence leaves the search as soon as none of its alive hypotheses can beat its k-th
    finished one (that bound only tightens, so its result is final), or at its limit, where
    its alive hypotheses compete with the finished ones as they are: the decoder then runs on
    the remaining sentences only. The results are those of searching every sentence to the end.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    k = beam_size
    limits = decode_limits(model, source_ids, max_length)  # [B]
    max_length = tf.reduce_max(tf.concat([limits, [1]], 0))  # the stores' largest capacity
    memory, source_padding = model.encode(source_ids, training=False)
    initial_cache = model.initial_cache(memory)
    # Each beam's best 2k extensions (all V if fewer) hold the sentence's best 2k.
    per_beam = min(2 * k, model.settings["target_vocab_size"])

    # A hypothesis's tracks: its ids [.., t] and, with return_attention, its attention rows
    # [.., t, S]. Sentences still searched (A of them) carry their index in the batch, their
    # limit, hypotheses, source padding and encoder keys/values, all [A, ...] (a sentence's k
    # beams query its encoder keys/values together). Only beam 0 is live at first, so the
    # first step does not pick k copies.
    def no_tracks(rows):
        tracks = {"ids": tf.zeros([rows, k, 0], tf.int32)}
        if return_attention:
            tracks["attention"] = tf.zeros([rows, k, 0, tf.shape(source_ids)[1]])
        return tracks

    sentences = {
        "index": tf.range(batch),  # [A]
        "limit": limits,  # [A]
        "alive": no_tracks(batch),
        "alive_log_probs": tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1]),
        "finished": no_tracks(batch),
        "finished_scores": tf.fill([batch, k], NEG_INF),  # [A, K]
        "source_padding": source_padding,  # [A, S]
        "memory": [c["memory"] for c in initial_cache],  # per layer {key, value} [A, H, S, Dh]
    }
    # Self-attention keys/values: per layer, stores written in place (kv_cache.py) with one
    # slot per hypothesis row of the full batch, sentence b's beam j in slot b * K + j; each
    # alive hypothesis's ancestry [A*K, t] says which slot held its prefix at each time.
    slots = batch * k
    heads, stores = kv_cache.empty_stores(initial_cache)
    ancestry = tf.zeros([batch * k, 0], tf.int32)
    last_tokens = tf.fill([batch * k], BOS_ID)  # [A*K]
    # The k finished hypotheses of the sentences that left, [B, K, ...] (the others' rows are
    # filled when they leave, or at the end).
    results = {"tracks": no_tracks(batch), "scores": tf.fill([batch, k], NEG_INF)}

    def pad_time(tracks, length):
        def pad(t):
            padding = [[0, 0], [0, 0], [0, length - tf.shape(t)[2]]] + [[0, 0]] * (t.shape.rank - 3)
            return tf.pad(t, padding, constant_values=PAD_ID if t.dtype == tf.int32 else 0)
        return tf.nest.map_structure(pad, tracks)

    def gather_beams(tracks, beams):
        return tf.nest.map_structure(lambda t: _gather_beams(t, beams), tracks)

    def store(results, sentences, length):
        """results with the rows of `sentences` replaced by their finished hypotheses."""
        return {"tracks": tf.nest.map_structure(
                    lambda full, rows: replace_rows(full, sentences["index"], rows),
                    pad_time(results["tracks"], length), sentences["finished"]),
                "scores": replace_rows(results["scores"], sentences["index"],
                                       sentences["finished_scores"])}

    def complete(sentences, length):
        """The sentences' k best of their finished and alive hypotheses, the alive ones scored
        as ending at `length`. At a sentence's limit they end there; a sentence that leaves by
        the bound keeps its finished ones (none alive beats them, and on ties top_k keeps the
        first)."""
        alive_log_probs = sentences["alive_log_probs"]
        alive_scores = tf.where(alive_log_probs > NEG_INF / 2,
                                alive_log_probs / length_penalty(length, alpha), NEG_INF)
        scores, best = tf.math.top_k(
            tf.concat([sentences["finished_scores"], alive_scores], axis=1), k=k)  # [A, K]
        tracks = tf.nest.map_structure(lambda old, alive: tf.concat([old, alive], axis=1),
                                       pad_time(sentences["finished"], length),
                                       sentences["alive"])
        return dict(sentences, finished=gather_beams(tracks, best), finished_scores=scores)

    def not_done(step, sentences, *_):  # every sentence leaves by its limit
        return tf.size(sentences["index"]) > 0

    def step_fn(step, sentences, stores, ancestry, last_tokens, results):
        active_count = tf.shape(sentences["index"])[0]
        row_slots = tf.reshape(sentences["index"][:, None] * k + tf.range(k), [-1])  # [A*K]
        rows = kv_cache.step_rows(step, slots, heads, row_slots, ancestry)
        stores = kv_cache.grow(stores, step, slots, heads, max_length)
        cache = [{"self": dict(s, **rows), "memory": m}
                 for s, m in zip(stores, sentences["memory"])]
        result = model.decode_step(last_tokens[:, None], step, cache,
                                   sentences["source_padding"], return_attention=return_attention)
        logits, cache = result[:2]
        stores = [c["self"] for c in cache]
        # 2k candidates: even if k of them end in EOS, k remain to continue.
        row_log_probs, row_tokens = top_log_probs(logits, per_beam)  # [A*K, P]
        candidates = (sentences["alive_log_probs"][:, :, None]
                      + _split_beams(row_log_probs, k))  # [A, K, P]
        flat = tf.reshape(candidates, [active_count, k * per_beam])
        best_log_probs, top_index = tf.math.top_k(flat, k=2 * k)  # [A, 2K]
        top_beam = top_index // per_beam
        top_token = tf.gather(tf.reshape(row_tokens, [active_count, k * per_beam]), top_index,
                              batch_dims=1)
        step_tracks = {"ids": top_token}  # [A, 2K, ...]: this step's entry of each candidate
        if return_attention:
            step_tracks["attention"] = _gather_beams(_split_beams(result[2], k), top_beam)
        top = tf.nest.map_structure(lambda t, new: tf.concat([t, new[:, :, None]], axis=2),
                                    gather_beams(sentences["alive"], top_beam), step_tracks)
        ends = tf.equal(top_token, EOS_ID)

        # Continue with the k best that did not end.
        continue_scores = best_log_probs + tf.cast(ends, tf.float32) * NEG_INF
        continue_scores, keep = tf.math.top_k(continue_scores, k=k)  # [A, K]
        source_beam = _gather_beams(top_beam, keep)  # which old beam each new one extends

        # Finished: the k best of those finished before and those ending now.
        length = step + 1
        ended_scores = best_log_probs / length_penalty(length, alpha)
        ended_scores += tf.cast(tf.logical_not(ends), tf.float32) * NEG_INF
        all_scores = tf.concat([sentences["finished_scores"], ended_scores], axis=1)
        finished_scores, best = tf.math.top_k(all_scores, k=k)  # [A, K]
        all_finished = tf.nest.map_structure(lambda old, new: tf.concat([old, new], axis=1),
                                             pad_time(sentences["finished"], length), top)
        sentences = dict(sentences, alive=gather_beams(top, keep), alive_log_probs=continue_scores,
                         finished=gather_beams(all_finished, best),
                         finished_scores=finished_scores)

        # A sentence stays below its limit while its best alive hypothesis, under the largest
        # length penalty it can still reach, beats its k-th finished one (log-probs only fall
        # from here).
        limit = sentences["limit"]  # [A]
        staying = tf.logical_and(
            length < limit,
            continue_scores[:, 0] / length_penalty(limit, alpha) > finished_scores[:, -1])
        staying_index = tf.cast(tf.where(staying)[:, 0], tf.int32)  # [A']
        # Each new hypothesis inherits the ancestry of the old beam it extends (in the staying
        # sentences), that beam's slot at this step appended.
        beam_rows = tf.gather(source_beam + tf.range(active_count)[:, None] * k, staying_index)
        ancestry = tf.gather(tf.concat([ancestry, row_slots[:, None]], axis=1),
                             tf.reshape(beam_rows, [-1]))

        def some_leave():  # store their results; the others' state shrinks to them
            leaving = tf.cast(tf.where(tf.logical_not(staying))[:, 0], tf.int32)
            left = tf.nest.map_structure(lambda t: tf.gather(t, leaving), {
                name: sentences[name] for name in
                ("index", "finished", "finished_scores", "alive", "alive_log_probs")})
            return (store(results, complete(left, length), length),
                    tf.nest.map_structure(lambda t: tf.gather(t, staying_index), sentences))

        results, sentences = tf.cond(tf.reduce_all(staying), lambda: (results, sentences),
                                     some_leave)
        last_tokens = tf.reshape(sentences["alive"]["ids"][:, :, -1], [-1])
        return step + 1, sentences, stores, ancestry, last_tokens, results

    def track_shapes(tracks):  # time (axis 2) grows; so may the batch
        return tf.nest.map_structure(lambda t: tf.TensorShape([None, k, None] + t.shape[3:]),
                                     tracks)

    scores_shape = tf.TensorShape([None, k])
    invariants = (
        tf.TensorShape([]),
        {"index": tf.TensorShape([None]), "limit": tf.TensorShape([None]),
         "alive": track_shapes(sentences["alive"]),
         "alive_log_probs": scores_shape, "finished": track_shapes(sentences["finished"]),
         "finished_scores": scores_shape, "source_padding": tf.TensorShape([None, None]),
         "memory": _memory_invariants(initial_cache)},
        kv_cache.store_invariants(stores), tf.TensorShape([None, None]), tf.TensorShape([None]),
        {"tracks": track_shapes(results["tracks"]), "scores": scores_shape})
    _, _, _, _, _, results = tf.while_loop(
        not_done, step_fn, (tf.constant(0), sentences, stores, ancestry, last_tokens, results),
        shape_invariants=invariants)
    # [B, K, ...], each sentence's best first
    ids, scores = results["tracks"]["ids"][:, :n_best], results["scores"][:, :n_best]
    if return_attention:
        return ids, scores, results["tracks"]["attention"][:, :n_best]
    return ids, scores
