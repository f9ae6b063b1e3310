"""Batched beam search with a GNMT length penalty, in pure TensorFlow (tf.while_loop; no
py_function, no TF Addons ops), so that it runs inside a SavedModel under TF Serving.

Hypotheses are scored as log P(y | x) / lp(|y|), lp(n) = ((5 + n) / 6)^alpha (Wu et al., 2016),
where |y| counts the generated tokens including EOS. A sentence's search stops at its own
length limit, or earlier by one of two rules (`STOP_RULES`): "finished", once k of its
hypotheses have ended (CTranslate2's and fairseq's rule), or "bound", once none of its
unfinished hypotheses can still beat its k-th finished one under the largest length penalty
it could reach (the beam's exact result, at ~1.3-1.4x the decoding time). It then leaves the
batch, so the decoder runs on fewer rows while the others go on. Nothing of a sentence's
search depends on the other sentences of its batch.
"""
import tensorflow as tf

from tfnmt.data.special_tokens import PAD_ID
from tfnmt.inference.decoding import (DecodingStrategy, dynamic_decode, forced_tokens,
                                      repeated_ngram_tokens, replace_rows)

NEG_INF = -1e9
# When a sentence's search ends before its limit (module docstring).
STOP_RULES = ("finished", "bound")


def length_penalty(length, alpha):
    """The GNMT length penalty lp(|y|) = ((5 + |y|) / 6)^alpha (Wu et al., 2016).

    Args:
      length: output lengths, any int shape.
      alpha: the exponent (0: no penalty).

    Returns:
      float32, the shape of `length`.
    """
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _split_beams(x, beam_size):
    """[B*K, ...] -> [B, K, ...]"""
    if x.shape[1:].is_fully_defined():  # a constant shape: no shape arithmetic at run time
        return tf.reshape(x, [-1, beam_size] + x.shape[1:].as_list())
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] // beam_size, beam_size], shape[1:]], 0))


def _gather_beams(x, indices):
    """x [B, K, ...], indices [B, K'] -> [B, K', ...]"""
    return tf.gather(x, indices, batch_dims=1)


def _pad_time(tracks, length=None, axis=2):
    """Tracks [A, K, t, ...] padded along time (`axis`) to `length`; without it, by one step
    (constant paddings: no shape arithmetic in a search step)."""
    def pad(t):
        extra = 1 if length is None else length - tf.shape(t)[axis]
        padding = [[0, 0]] * axis + [[0, extra]] + [[0, 0]] * (t.shape.rank - axis - 1)
        return tf.pad(t, padding, constant_values=PAD_ID if t.dtype == tf.int32 else 0)
    return tf.nest.map_structure(pad, tracks)


def _gather_tracks(tracks, beams):
    return tf.nest.map_structure(lambda t: _gather_beams(t, beams), tracks)


class BeamSearch(DecodingStrategy):
    """K hypotheses per sentence scored by log P(y | x) / lp(|y|); a sentence leaves at its
    limit, or earlier by the `stop` rule: once K hypotheses have ended ("finished"), or once
    none of its alive hypotheses can beat its K-th finished one ("bound"). With
    `no_repeat_ngram_size` N, no hypothesis takes a token that would repeat one of its N-grams
    of subwords (the rule of fairseq and CTranslate2): as in fairseq, the token is left out of
    the step's choice and the scores stay the model's log-probabilities (CTranslate2
    renormalises the others).

    A hypothesis's *tracks* are its ids [.., t] and, with return_attention, its attention rows
    [.., t, S]. Per sentence still searched: its index and limit, alive hypotheses with their
    log-probabilities and last tokens, and the K best finished ones with their scores. Only
    beam 0 is alive at first, so the first step does not pick K copies. Results: the K best
    finished hypotheses of every sentence [B, K, ...], filled as sentences leave.

    finalize -> (ids [B, N, L] without BOS, PAD after EOS; scores [B, N]; with return_attention,
    the last decoder layer's cross-attention averaged over heads [B, N, L, S]), N = n_best,
    best first.

    Args:
      beam_size: K, hypotheses kept per sentence.
      alpha: the length penalty's exponent.
      n_best: hypotheses returned per sentence, <= beam_size.
      vocab_size: the output vocabulary's size, which caps the candidates kept per beam
        (2 * beam_size).
      stop: "finished" or "bound" (`STOP_RULES`).
      no_repeat_ngram_size: N > 0 forbids repeating an N-gram of subwords within a
        hypothesis; 0 allows it.
      **kwargs: `DecodingStrategy`'s.

    Example:
      ids, scores = dynamic_decode(model, BeamSearch(beam_size=4, alpha=0.6), source_ids)
    """

    time_axis = 2  # of the tracks: [A, K, t, ...]

    def __init__(self, beam_size=4, alpha=0.6, n_best=1, vocab_size=None, stop="finished",
                 no_repeat_ngram_size=0, **kwargs):
        super().__init__(**kwargs)
        if not 1 <= n_best <= beam_size:
            raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
        if stop not in STOP_RULES:
            raise ValueError(f"stop must be one of {STOP_RULES}, got {stop!r}")
        if no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size must be >= 0, got {no_repeat_ngram_size}")
        self.stop, self.no_repeat_ngram_size = stop, int(no_repeat_ngram_size)
        self.rows_per_sentence = self.k = beam_size
        self.alpha, self.n_best = alpha, n_best
        # Each beam's best 2k extensions (all V if fewer) hold the sentence's best 2k.
        self.per_beam = 2 * beam_size if vocab_size is None else min(2 * beam_size, vocab_size)

    def _no_tracks(self, rows, source_length):
        tracks = {"ids": tf.zeros([rows, self.k, 0], tf.int32)}
        if self.return_attention:
            tracks["attention"] = tf.zeros([rows, self.k, 0, source_length])
        return tracks

    def initialize(self, batch, limits, source_length):
        k = self.k
        sentences = self.with_prefix({
            "index": tf.range(batch),  # [A]
            "limit": limits,  # [A]
            "tokens": tf.fill([batch, k], self.bos_id),  # [A, K]
            "alive": self._no_tracks(batch, source_length),
            "alive_log_probs": tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1]),
            "finished": self._no_tracks(batch, source_length),
            "finished_scores": tf.fill([batch, k], NEG_INF),  # [A, K]
        })
        results = {"tracks": self._no_tracks(batch, source_length),
                   "scores": tf.fill([batch, k], NEG_INF)}
        return sentences, results

    def last_tokens(self, sentences):
        return tf.reshape(sentences["tokens"], [-1])

    def step(self, step, log_probs_of, attention, sentences, results):
        k, per_beam = self.k, self.per_beam
        banned = None
        if self.no_repeat_ngram_size:
            ids = sentences["alive"]["ids"]  # [A, K, t]
            banned = repeated_ngram_tokens(tf.reshape(ids, [-1, tf.shape(ids)[2]]),
                                           self.no_repeat_ngram_size)  # [A*K, t]
        # 2k candidates: even if k of them end in EOS, k remain to continue.
        row_log_probs, row_tokens = log_probs_of(per_beam, banned)  # [A*K, P]
        if self.prefix is not None:  # a forced row's one candidate: its prefix token
            active = tf.shape(sentences["index"])[0]
            prefix_tokens, forced = forced_tokens(step, sentences)  # [A]
            rows_token = tf.repeat(prefix_tokens, k)
            rows_forced = tf.repeat(forced, k)[:, None]
            only = tf.concat([log_probs_of.of(rows_token)[:, None],
                              tf.fill([active * k, per_beam - 1], NEG_INF)], axis=1)
            row_log_probs = tf.where(rows_forced, only, row_log_probs)
            row_tokens = tf.where(rows_forced, tf.tile(rows_token[:, None], [1, per_beam]),
                                  row_tokens)
        candidates = (sentences["alive_log_probs"][:, :, None]
                      + _split_beams(row_log_probs, k))  # [A, K, P]
        flat = tf.reshape(candidates, [-1, k * per_beam])
        best_log_probs, top_index = tf.math.top_k(flat, k=2 * k)  # [A, 2K]
        top_beam = top_index // per_beam
        top_token = tf.gather(tf.reshape(row_tokens, [-1, k * per_beam]), top_index,
                              batch_dims=1)
        step_tracks = {"ids": top_token}  # [A, 2K, ...]: this step's entry of each candidate
        if attention is not None:
            step_tracks["attention"] = _gather_beams(_split_beams(attention, k), top_beam)
        top = tf.nest.map_structure(lambda t, new: tf.concat([t, new[:, :, None]], axis=2),
                                    _gather_tracks(sentences["alive"], top_beam), step_tracks)
        ends = tf.equal(top_token, self.eos_id)

        # Continue with the k best that did not end.
        continue_scores = best_log_probs + tf.cast(ends, tf.float32) * NEG_INF
        continue_scores, keep = tf.math.top_k(continue_scores, k=k)  # [A, K]
        parents = _gather_beams(top_beam, keep)  # which old beam each new one extends

        # Finished: the k best of those finished before and those ending now.
        length = step + 1
        # A candidate of a beam that is not there (at first only beam 0 is) ends as nothing.
        real_ends = tf.logical_and(ends, best_log_probs > NEG_INF / 2)
        finished, finished_scores = self._finish(sentences, top, best_log_probs, real_ends,
                                                 length)
        alive = _gather_tracks(top, keep)
        sentences = dict(sentences, tokens=alive["ids"][:, :, -1], alive=alive,
                         alive_log_probs=continue_scores, finished=finished,
                         finished_scores=finished_scores)
        limit = sentences["limit"]  # [A]
        staying = tf.logical_and(length < limit,
                                 self._going_on(continue_scores, finished_scores, limit))
        return sentences, results, parents, staying

    def _finish(self, sentences, top, log_probs, ends, length):
        """The k best finished hypotheses: those finished before and the candidates `top`
        (log_probs [A, 2K]) that end now (ends [A, 2K]), at `length`.

        Returns:
          (tracks [A, K, length, ...], scores [A, K]).
        """
        finished_scores, best = tf.math.top_k(tf.concat(
            [sentences["finished_scores"], self._ended_scores(log_probs, ends, length)],
            axis=-1), k=self.k)
        # Finished tracks hold `step` positions: one more makes them as long as `top`'s.
        return self._best_tracks(_pad_time(sentences["finished"], axis=self.time_axis), top,
                                 best), finished_scores

    def _ended_scores(self, log_probs, ends, length):
        """log_probs [A, J] of hypotheses ending at `length` where `ends` [A, J] -> their scores
        [A, J], NEG_INF elsewhere."""
        return tf.where(ends, log_probs / length_penalty(length, self.alpha), NEG_INF)

    def _best_tracks(self, kept, others, best):
        """kept [A, K, t, ...], others [A, J, t, ...] -> the `best` [A, K] of their K + J."""
        return _gather_tracks(tf.nest.map_structure(
            lambda a, b: tf.concat([a, b], axis=1), kept, others), best)

    def _going_on(self, continue_scores, finished_scores, limit):
        """[A] bool: the sentences whose search the `stop` rule goes on with."""
        if self.stop == "finished":  # until k have ended
            return finished_scores[:, -1] <= NEG_INF / 2
        # While its best alive hypothesis, under the largest length penalty it can still
        # reach, beats its k-th finished one (log-probs only fall from here).
        return continue_scores[:, 0] / length_penalty(limit, self.alpha) > finished_scores[:, -1]

    def leave(self, results, left, length):
        """Records the k best hypotheses of the left sentences: their finished ones and, for a
        sentence at its limit, its alive ones too, scored as ending there (cut off). A
        sentence that leaves before its limit returns finished hypotheses only.

        Args:
          results, left, length: as for `DecodingStrategy.leave`.

        Returns:
          The results with the left sentences' n_best recorded.
        """
        alive_log_probs = left["alive_log_probs"]
        cut_off = tf.logical_and((length >= left["limit"])[:, None],
                                 alive_log_probs > NEG_INF / 2)  # [A, K]
        scores, best = tf.math.top_k(tf.concat(
            [left["finished_scores"], self._ended_scores(alive_log_probs, cut_off, length)],
            axis=-1), k=self.k)  # [A, K]
        tracks = self._best_tracks(_pad_time(left["finished"], length, axis=self.time_axis),
                                   left["alive"], best)
        return {"tracks": tf.nest.map_structure(
                    lambda full, rows: replace_rows(full, left["index"], rows),
                    _pad_time(results["tracks"], length, axis=self.time_axis), tracks),
                "scores": replace_rows(results["scores"], left["index"], scores)}

    def finalize(self, results, batch, source_length):
        tracks, scores = results["tracks"], results["scores"]  # [B, K, ...], best first
        outputs = (tracks["ids"][:, :self.n_best], scores[:, :self.n_best])
        if self.return_attention:
            outputs += (tracks["attention"][:, :self.n_best],)
        return outputs


class AlphaGridBeamSearch(BeamSearch):
    """`BeamSearch` under several length penalties at once: for each alpha of `alphas`, what a
    `BeamSearch` with that alpha returns, for about the decoding work of one search.

    Alpha scores only the finished hypotheses: the alive beam is ranked by log-probability,
    and the "finished" rule counts the hypotheses that ended. So one alive beam serves every
    alpha, beside K finished hypotheses per alpha. Under the "bound" rule a sentence goes on
    while any alpha's bound says so; what it finds after an alpha's bound has failed cannot
    enter that alpha's K best (up to exact ties of score), but the rows it shares a step with
    differ from a single alpha's search, so its products may round differently.

    finalize -> (ids [B, M, N, L], scores [B, M, N]), M = len(alphas), N = n_best, best first.

    Args:
      alphas: the length penalty's exponents, M of them.
      beam_size, n_best, vocab_size, stop, no_repeat_ngram_size, **kwargs: `BeamSearch`'s
        (no return_attention).

    Example:
      ids, scores = dynamic_decode(model, AlphaGridBeamSearch([0.6, 1.2]), source_ids)
    """

    time_axis = 3  # of the finished tracks and results: [A, M, K, t]

    def __init__(self, alphas, beam_size=4, n_best=1, vocab_size=None, stop="finished",
                 no_repeat_ngram_size=0, **kwargs):
        if kwargs.get("return_attention"):
            raise ValueError("AlphaGridBeamSearch keeps no attention")
        super().__init__(beam_size, None, n_best, vocab_size, stop, no_repeat_ngram_size,
                         **kwargs)
        self.alpha = tf.constant(alphas, tf.float32)  # [M]
        self.m = len(alphas)

    def initialize(self, batch, limits, source_length):
        sentences, results = super().initialize(batch, limits, source_length)
        def per_alpha(t):  # [A, K, ...] -> [A, M, K, ...]
            return tf.tile(t[:, None], [1, self.m] + [1] * (t.shape.rank - 1))
        for key in ("finished", "finished_scores"):
            sentences[key] = tf.nest.map_structure(per_alpha, sentences[key])
        return sentences, tf.nest.map_structure(per_alpha, results)

    def _ended_scores(self, log_probs, ends, length):  # [A, J] -> [A, M, J]
        penalties = length_penalty(length, self.alpha)[:, None]  # [M, 1]
        return tf.where(ends[:, None], log_probs[:, None] / penalties, NEG_INF)

    def _best_tracks(self, finished, others, best):
        """finished [A, M, K, t], others [A, J, t] (every alpha's) -> the `best` [A, M, K] of
        their K + J per alpha."""
        def pick(kept, new):
            new = tf.tile(new[:, None], [1, self.m, 1, 1])  # [A, M, J, t]
            return tf.gather(tf.concat([kept, new], axis=2), best, batch_dims=2)
        return tf.nest.map_structure(pick, finished, others)

    def _going_on(self, continue_scores, finished_scores, limit):
        if self.stop == "finished":  # k ended: the same count under every alpha
            return finished_scores[:, 0, -1] <= NEG_INF / 2
        bounds = continue_scores[:, :1] / length_penalty(limit[:, None], self.alpha)  # [A, M]
        return tf.reduce_any(bounds > finished_scores[:, :, -1], axis=1)

    def finalize(self, results, batch, source_length):
        return (results["tracks"]["ids"][:, :, :self.n_best],
                results["scores"][:, :, :self.n_best])


def beam_search(model, source_ids, beam_size=4, alpha=0.6, max_length=None, n_best=1,
                return_attention=False, prefix=None, stop="finished", no_repeat_ngram_size=0):
    """Beam search (`dynamic_decode` with `BeamSearch`): each sentence's results are those of
    searching it alone.

    Args:
      model: a `Transformer`.
      source_ids: [B, S] int32, PAD-padded, EOS-terminated.
      beam_size: hypotheses kept per sentence (paper: 4).
      alpha: the GNMT length-penalty exponent (paper: 0.6).
      max_length: output limit, a scalar or [B]; default each sentence's source length + 50
        subwords (`decoding.decode_limits`).
      n_best: hypotheses returned per sentence, <= beam_size.
      return_attention: also return the last decoder layer's cross-attention.
      prefix: [B, P] int32 subword ids each output must start with (PAD-padded), or None.
      stop: when a sentence's search ends before its limit: "finished" (once beam_size
        hypotheses have ended) or "bound" (once none can beat them; `STOP_RULES`).
      no_repeat_ngram_size: N > 0 forbids repeating an N-gram of subwords within an output.

    Returns:
      (ids [B, N, L] without BOS, PAD after EOS; scores [B, N], log P / length penalty;
      with return_attention, the cross-attention averaged over heads [B, N, L, S]),
      N = n_best, best first.
    """
    strategy = BeamSearch(beam_size, alpha, n_best, model.settings["target_vocab_size"],
                          stop=stop, no_repeat_ngram_size=no_repeat_ngram_size,
                          return_attention=return_attention, prefix=prefix)
    return dynamic_decode(model, strategy, source_ids, max_length)


def beam_search_alphas(model, source_ids, alphas, beam_size=4, max_length=None, n_best=1,
                       prefix=None, stop="finished", no_repeat_ngram_size=0):
    """`beam_search` under each length penalty of `alphas`, in one search
    (`AlphaGridBeamSearch`): a dev split is searched once for a whole grid of alphas.

    Args:
      alphas: M exponents; the others as for `beam_search`.

    Returns:
      (ids [B, M, N, L], scores [B, M, N]): for each alpha, what `beam_search` returns.
    """
    strategy = AlphaGridBeamSearch(alphas, beam_size, n_best,
                                   model.settings["target_vocab_size"], stop=stop,
                                   no_repeat_ngram_size=no_repeat_ngram_size, prefix=prefix)
    return dynamic_decode(model, strategy, source_ids, max_length)
