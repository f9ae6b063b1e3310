"""Batched beam search with a GNMT length penalty, in pure TensorFlow (tf.while_loop; no
py_function, no TF Addons ops), so that it runs inside a SavedModel under TF Serving.

Hypotheses are scored as log P(y | x) / lp(|y|), lp(n) = ((5 + n) / 6)^alpha (Wu et al., 2016),
where |y| counts the generated tokens including EOS. Search stops when no unfinished hypothesis
can still beat the k-th finished one of its sentence (or at max_length).
"""
import tensorflow as tf

from tfnmt.decoding import _cache_invariants, default_max_length
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
    source + 50."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    k = beam_size
    if max_length is None:
        max_length = default_max_length(source_ids)
    max_length = tf.convert_to_tensor(max_length, tf.int32)
    memory, source_padding = model.encode(source_ids, training=False)
    # Every beam of a sentence shares the encoder output: repeat it k times along the batch.
    memory = tf.repeat(memory, k, axis=0)  # [B*K, S, D]
    source_padding = tf.repeat(source_padding, k, axis=0)  # [B*K, S]
    cache = model.initial_cache(memory)
    vocab_size = model.settings["target_vocab_size"]

    # Alive hypotheses: only beam 0 is live at first, so the first step does not pick k copies.
    alive_seq = tf.zeros([batch, k, 0], tf.int32)
    alive_log_probs = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1])
    finished_seq = tf.zeros([batch, k, 0], tf.int32)
    finished_scores = tf.fill([batch, k], NEG_INF)
    last_tokens = tf.fill([batch * k], BOS_ID)
    # Attention rows follow their hypotheses; without return_attention they are [.., 0] wide.
    attention_width = tf.shape(source_ids)[1] if return_attention else 0
    alive_attn = tf.zeros([batch, k, 0, attention_width])
    finished_attn = alive_attn

    def pad_time(seq, length):
        padding = [[0, 0], [0, 0], [0, length - tf.shape(seq)[2]]] + [[0, 0]] * (seq.shape.rank - 3)
        return tf.pad(seq, padding, constant_values=PAD_ID if seq.dtype == tf.int32 else 0)

    def not_done(step, alive_seq, alive_log_probs, finished_seq, finished_scores, last_tokens,
                 cache, alive_attn, finished_attn):
        # The best an alive hypothesis can still reach: its log-prob (which only falls) under
        # the largest length penalty it can get.
        best_alive = alive_log_probs[:, 0] / length_penalty(max_length, alpha)
        worst_finished = tf.reduce_min(finished_scores, axis=1)
        can_improve = tf.reduce_any(best_alive > worst_finished)
        return tf.logical_and(step < max_length, can_improve)

    def step_fn(step, alive_seq, alive_log_probs, finished_seq, finished_scores, last_tokens,
                cache, alive_attn, finished_attn):
        result = model.decode_step(last_tokens[:, None], step, cache, source_padding,
                                   return_attention=return_attention)
        logits, cache = result[:2]
        step_attn = (_split_beams(result[2], k) if return_attention
                     else tf.zeros([batch, k, 0]))  # [B, K, S]
        log_probs = _split_beams(tf.nn.log_softmax(logits), k)  # [B, K, V]
        candidates = alive_log_probs[:, :, None] + log_probs  # [B, K, V]
        flat = tf.reshape(candidates, [batch, k * vocab_size])
        # 2k candidates: even if k of them end in EOS, k remain to continue.
        top_log_probs, top_index = tf.math.top_k(flat, k=2 * k)  # [B, 2K]
        top_beam = top_index // vocab_size
        top_token = top_index % vocab_size
        top_seq = tf.concat([_gather_beams(alive_seq, top_beam), top_token[:, :, None]], axis=2)
        top_attn = tf.concat([_gather_beams(alive_attn, top_beam),
                              _gather_beams(step_attn, top_beam)[:, :, None]], axis=2)
        ends = tf.equal(top_token, EOS_ID)

        # Continue with the k best that did not end.
        continue_scores = top_log_probs + tf.cast(ends, tf.float32) * NEG_INF
        continue_scores, keep = tf.math.top_k(continue_scores, k=k)  # [B, K]
        new_alive_seq = _gather_beams(top_seq, keep)
        new_alive_attn = _gather_beams(top_attn, keep)
        source_beam = _gather_beams(top_beam, keep)  # which old beam each new one extends
        flat_index = tf.reshape(source_beam + tf.range(batch)[:, None] * k, [-1])
        # Only the self-attention keys/values follow their beams: the encoder's are the same
        # for every beam of a sentence, so reordering them would copy them for nothing.
        cache = [{"self": tf.nest.map_structure(lambda t: tf.gather(t, flat_index), c["self"]),
                  "memory": c["memory"]} for c in cache]
        new_last_tokens = tf.reshape(new_alive_seq[:, :, -1], [-1])

        # Finished: the k best of those finished before and those ending now.
        length = step + 1
        ended_scores = top_log_probs / length_penalty(length, alpha)
        ended_scores += tf.cast(tf.logical_not(ends), tf.float32) * NEG_INF
        all_seq = tf.concat([pad_time(finished_seq, length), top_seq], axis=1)  # [B, 3K, t+1]
        all_scores = tf.concat([finished_scores, ended_scores], axis=1)
        finished_scores, best = tf.math.top_k(all_scores, k=k)
        finished_seq = _gather_beams(all_seq, best)
        all_attn = tf.concat([pad_time(finished_attn, length), top_attn], axis=1)
        finished_attn = _gather_beams(all_attn, best)
        return (step + 1, new_alive_seq, continue_scores, finished_seq, finished_scores,
                new_last_tokens, cache, new_alive_attn, finished_attn)

    loop_vars = (tf.constant(0), alive_seq, alive_log_probs, finished_seq, finished_scores,
                 last_tokens, cache, alive_attn, finished_attn)
    attn_shape = tf.TensorShape([None, k, None, None])
    invariants = (tf.TensorShape([]), tf.TensorShape([None, k, None]),
                  tf.TensorShape([None, k]), tf.TensorShape([None, k, None]),
                  tf.TensorShape([None, k]), tf.TensorShape([None]), _cache_invariants(cache),
                  attn_shape, attn_shape)
    (step, alive_seq, alive_log_probs, finished_seq, finished_scores, _, _, alive_attn,
     finished_attn) = tf.while_loop(not_done, step_fn, loop_vars, shape_invariants=invariants)

    # A sentence with fewer than k finished hypotheses (max_length reached) is completed with
    # its alive ones, scored by the same length penalty.
    length = tf.shape(alive_seq)[2]
    alive_scores = alive_log_probs / length_penalty(length, alpha)
    all_seq = tf.concat([pad_time(finished_seq, length), alive_seq], axis=1)
    all_scores = tf.concat([finished_scores,
                            tf.where(alive_log_probs > NEG_INF / 2, alive_scores, NEG_INF)], 1)
    scores, best = tf.math.top_k(all_scores, k=n_best)
    if return_attention:
        all_attn = tf.concat([pad_time(finished_attn, length), alive_attn], axis=1)
        return _gather_beams(all_seq, best), scores, _gather_beams(all_attn, best)
    return _gather_beams(all_seq, best), scores
