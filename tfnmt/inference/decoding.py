"""Incremental decoding: one loop (`dynamic_decode`) driving a `DecodingStrategy` (greedy and
sampling in greedy_search.py, beam search in beam_search.py), what strategies share (each
sentence's limit, the exact top-k of log-probabilities, row replacement), and greedy decoding
by full recomputation, the reference the incremental decoders are checked against."""
import tensorflow as tf

from tfnmt import fast_ops
from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID
from tfnmt.inference.search_memory import EXTRA_LENGTH  # TensorFlow-free: train.py's checks
from tfnmt.model import kv_cache

# `top_log_probs` sums exp(x) of a row's logits without shifting them by its best, x*, where
# |x*| <= this: no term overflows (V e^64 < 3e38 for V < 1e10) and e^x* stays a normal float.
PLAIN_EXP_RANGE = 64.0


def greedy_decode_uncached(model, source_ids, max_length, bos_id=BOS_ID, eos_id=EOS_ID):
    """Greedy decoding that re-runs the decoder over the whole prefix at each step (O(T²) work):
    simple and obviously right, used in tests and as the baseline of the incremental decoders.

    Args:
      model: a `Transformer`.
      source_ids: [B, S] int32.
      max_length: the longest output.
      bos_id, eos_id: the start and end tokens.

    Returns:
      Output ids [B, <= max_length] without BOS; PAD after EOS.
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
    """Each sentence's output limit, per sentence, so that a sentence's output does not depend on
    the other sentences of its batch.

    Args:
      model: a `Transformer` (its learned-position table bounds the limit).
      source_ids: [B, S] int32.
      max_length: a scalar or [B] limit; None for each source's own length (EOS included) + `extra`
        (paper §6.1: input + 50).
      extra: subwords allowed beyond the source's length.

    Returns:
      [B] int32, at least 1.
    """
    batch = tf.shape(source_ids)[0]
    if max_length is None:
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
        limits = lengths + extra
    else:
        limits = tf.broadcast_to(tf.cast(max_length, tf.int32), [batch])
    if model.settings["position"] == "learned":  # step t embeds position t
        limits = tf.minimum(limits, model.settings["max_length"])
    return tf.maximum(limits, 1)


def top_log_probs(logits, count, width=32, banned=None):
    """logits [R, V] float32 -> (log-probabilities [R, count], token ids [R, count]): each
    row's `count` most likely tokens, best first, ties to the lower id: what
    top_k(log_softmax(logits), count) gives, without a log-softmax or a top-k over all V.
    With `banned`, those tokens are left out of each row's choice (-inf there if fewer than
    `count` are left) but not out of its normaliser: the log-probabilities stay the model's.

    On CPU both passes over [R, V] are a large part of a beam step. Here each
    row's logits are cut into chunks of `width` consecutive tokens (the last padded with -inf)
    and one max per chunk is taken. The `count` chunks with the largest maxima hold the row's
    `count` best tokens (a chunk holding one of them has a maximum at least the count-th best
    value, and at most `count` chunks do), so the top-k runs over count * width candidates.
    The log-normaliser is log sum exp(x), an exponential and a sum over [R, V], without first
    subtracting the row's best logit x* (another pass over [R, V]): only rows with
    |x*| > PLAIN_EXP_RANGE, where exp could overflow or the whole row underflow, take the
    shifted sum x* + log sum exp(x - x*). The float32 log-normaliser is then rounded to the
    spacing of numbers near x* (4e-6 at x* = 60), far below the rounding of the logits' own
    products.

    `logits` may also be a list of slices [R, V_i] along V (`linear.linear_slices`): each slice
    is then searched and summed on its own, independent ops that a graph's inter-op threads run
    at once, and only their [R, count] bests and sums are merged (the slices are never
    concatenated).

    Args:
      logits: [R, V] float32, or a list of [R, V_i] slices of it, each but the last a
        multiple of `width` wide (`linear.slice_bounds`).
      count: how many tokens per row, <= V.
      width: the chunk width.
      banned: None, or [R, W] int32 token ids each row may not choose, -1 for none
        (`repeated_ngram_tokens`).

    Returns:
      (log-probabilities [R, count], token ids [R, count] int32), best first, ties to the
      lower id.

    Raises:
      ValueError: a slice but the last is not a multiple of `width` wide.
    """
    slices = logits if isinstance(logits, (list, tuple)) else [logits]
    if any(part.shape[-1] % width for part in slices[:-1]):
        # Chunks are numbered across slices: a partial chunk inside would give wrong token ids.
        raise ValueError(f"every slice but the last must be a whole number of {width}-token "
                         f"chunks, got slices of {[part.shape[-1] for part in slices]}")
    if not fast_ops.enabled():
        log_probs = tf.nn.log_softmax(_joined(slices))
        if banned is not None:
            log_probs = _without([log_probs], banned)[0]
        return tf.math.top_k(log_probs, k=min(count, log_probs.shape[-1]))
    vocab = sum(part.shape[-1] for part in slices)
    count = min(count, vocab)

    def chunks_of(parts):
        # [R, C_i, width] chunks of each slice (every slice but the last a whole number of
        # chunks, `linear.slice_bounds`): token = chunk * width + offset, numbered across slices.
        chunked = [tf.reshape(_pad_to(part, width), [-1, -(-part.shape[-1] // width), width])
                   for part in parts]
        return chunked, [tf.reduce_max(part, axis=2) for part in chunked]  # maxima [R, C_i]

    chunked, maxima = chunks_of(slices)
    # The choice runs over the allowed tokens; the normaliser below over all of them.
    choice, choice_maxima = (chunked, maxima) if banned is None else \
        chunks_of(_without(slices, banned))
    kept = min(count, sum(part.shape[1] for part in chunked))
    _, best_chunks = tf.math.top_k(_joined(choice_maxima), k=kept)
    # In ascending order, so that candidates run in token order (tf.sort, without its shape ops).
    best_chunks = -tf.math.top_k(-best_chunks, k=kept).values  # [R, kept]
    candidates = _gather_chunks(choice, best_chunks)  # [R, kept, width]
    candidate_ids = best_chunks[:, :, None] * width + tf.range(width)
    top_logits, position = tf.math.top_k(tf.reshape(candidates, [-1, kept * width]), k=count)
    ids = tf.gather(tf.reshape(candidate_ids, [-1, kept * width]), position, batch_dims=1)
    # The row's best logit: a banned token's may be above the best allowed one.
    best = top_logits[:, :1] if banned is None else \
        tf.reduce_max(_joined(maxima), axis=1, keepdims=True)  # [R, 1]
    # log Σ exp(x) of the logits as they are: no pass subtracting each row's best first, which
    # only rows whose best logit lies outside ±PLAIN_EXP_RANGE need (exp would overflow or the
    # whole row underflow); they, and only they, take the shifted sum.
    log_sum = tf.math.log(_sum_of([tf.reduce_sum(tf.exp(part), axis=1, keepdims=True)
                                   for part in slices]))  # [R, 1]
    in_range = tf.abs(best) <= PLAIN_EXP_RANGE
    log_sum = tf.cond(tf.reduce_all(in_range), lambda: log_sum,
                      lambda: tf.where(in_range, log_sum, _shifted_log_sum(slices, maxima, best)))
    return top_logits - log_sum, ids


def _shifted_log_sum(slices, maxima, best):
    """log Σ exp(x) over [R, V_i] slices whose chunk maxima are `maxima` [R, C_i] and whose best
    logit is best [R, 1]: each slice summed relative to its own best (independent ops, for the
    inter-op threads), the sums rescaled to the row's best -> [R, 1]."""
    if len(slices) == 1:
        return best + tf.math.log(tf.reduce_sum(tf.exp(slices[0] - best), axis=1, keepdims=True))
    bests = [tf.reduce_max(part, axis=1, keepdims=True) for part in maxima]  # [R, 1]
    return best + tf.math.log(tf.add_n([
        tf.reduce_sum(tf.exp(part - part_best), axis=1, keepdims=True)
        * tf.exp(part_best - best) for part, part_best in zip(slices, bests)]))


def repeated_ngram_tokens(ids, n):
    """The tokens that would repeat an n-gram of each row's output: for every earlier place
    where the row's last n - 1 tokens occurred, the token that followed them there (n = 1:
    every token of the row).

    Args:
      ids: [R, t] int32, each row's output so far (without BOS).
      n: the n-gram length, >= 1.

    Returns:
      [R, t] int32: at position j, ids[:, j] where ids[:, j-n+1:j] equals the row's last n - 1
      tokens, else -1 (all -1 while a row has fewer than n - 1 tokens).
    """
    steps = tf.shape(ids)[1]
    # -1 before the first token: a window reaching before it matches no row's last tokens.
    padded = tf.pad(ids, [[0, 0], [n - 1, 0]], constant_values=-1)  # [R, n - 1 + t]
    last = padded[:, steps:]  # [R, n - 1]
    # Window j, padded[:, j:j + n - 1], is followed by ids[:, j].
    repeats = tf.ones_like(ids, tf.bool)
    for offset in range(n - 1):
        repeats &= tf.equal(padded[:, offset:offset + steps], last[:, offset:offset + 1])
    return tf.where(repeats, ids, -1)


def _without(slices, banned):
    """[R, V_i] slices along V with each row's `banned` tokens ([R, W] int32, -1 for none) set
    to -inf."""
    kept, first = [], 0
    for part in slices:
        size = part.shape[-1]
        inside = tf.cast(tf.where((banned >= first) & (banned < first + size)), tf.int32)
        columns = tf.gather_nd(banned, inside) - first  # [N]
        indices = tf.stack([inside[:, 0], columns], axis=1)  # [N, 2]: (row, column)
        kept.append(tf.tensor_scatter_nd_update(
            part, indices, tf.fill(tf.shape(columns), tf.constant(float("-inf"), part.dtype))))
        first += size
    return kept


def _sum_of(parts):
    """The sum of same-shaped tensors (one op only for more than one)."""
    return parts[0] if len(parts) == 1 else tf.add_n(parts)


def _joined(slices):
    """[R, V_i] slices along V -> [R, V] (a concat only for more than one)."""
    return slices[0] if len(slices) == 1 else tf.concat(slices, axis=1)


def _pad_to(logits, width):
    """logits [R, V] padded with -inf to a multiple of `width` columns."""
    extra = -logits.shape[-1] % width
    if not extra:
        return logits
    return tf.pad(logits, [[0, 0], [0, extra]], constant_values=float("-inf"))


def _gather_chunks(chunked, chunks):
    """chunked: [R, C_i, W] slices of [R, C, W]; chunks [R, K] int32 -> [R, K, W], the given
    chunks of each row, each from the slice that holds it."""
    if len(chunked) == 1:
        return tf.gather(chunked[0], chunks, batch_dims=1)
    gathered, first = None, 0
    for part in chunked:
        size = part.shape[1]
        inside = tf.clip_by_value(chunks - first, 0, size - 1)
        rows = tf.gather(part, inside, batch_dims=1)
        gathered = rows if gathered is None else tf.where(
            (chunks >= first)[:, :, None], rows, gathered)
        first += size
    return gathered


class StepLogProbs:
    """A decoding step's next-token distributions, one per hypothesis row: call it with a
    count for each row's best tokens (`top_log_probs`), or use `of` for given tokens.

    Args:
      logits: [R, V] float32, or a list of [R, V_i] slices of it along V.
    """

    def __init__(self, logits):
        self.logits = logits

    def __call__(self, count, banned=None):
        return top_log_probs(self.logits, count, banned=banned)

    def of(self, tokens):
        """log P of one given token per row: tokens [R] int32 -> [R] float32."""
        logits = self.logits
        log_probs = tf.nn.log_softmax(
            _joined(logits) if isinstance(logits, (list, tuple)) else logits)
        return tf.gather(log_probs, tokens[:, None], batch_dims=1)[:, 0]


def forced_tokens(step, sentences):
    """The prefix token each sentence is forced to at `step`, and whether it is forced.

    Args:
      step: the time step.
      sentences: a strategy's state with "prefix" [A, P] (PAD-padded subword ids).

    Returns:
      (tokens [A] int32, forced [A] bool).
    """
    prefix = sentences["prefix"]  # ends with a PAD column (`with_prefix`)
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(prefix, PAD_ID), tf.int32), axis=1)
    column = tf.minimum(step, tf.shape(prefix)[1] - 1)
    return prefix[:, column], step < lengths


def replace_rows(full, rows, updates):
    """Rows of a tensor replaced (a gather, since TensorScatterUpdate refuses tensors with an empty
    dimension, such as zero time steps).

    Args:
      full: [B, ...].
      rows: [A] int32 row indices.
      updates: [A, ...].

    Returns:
      `full` with the rows replaced.
    """
    batch = tf.shape(full)[0]
    selector = tf.tensor_scatter_nd_update(tf.range(batch), rows[:, None],
                                           batch + tf.range(tf.shape(rows)[0]))
    return tf.gather(tf.concat([full, updates], axis=0), selector)


def loop_shape_invariants(loop_vars):
    """tf.while_loop shape invariants for a nest of tensors and TensorArrays: each tensor keeps its
    rank, every dimension may change (sentences leave, histories grow).

    Args:
      loop_vars: a nest of tensors and TensorArrays.

    Returns:
      The same nest of TensorShapes (TensorArrays as they are).
    """
    def relaxed(value):
        if isinstance(value, tf.TensorArray):
            return tf.TensorShape(None)
        return tf.TensorShape([None] * value.shape.rank)
    return tf.nest.map_structure(relaxed, loop_vars)


class DecodingStrategy:
    """How a search picks the next tokens; `dynamic_decode` runs the loop around it.

    A strategy keeps `rows_per_sentence` hypotheses per sentence (1 for greedy, K for a beam)
    and two nests of tensors: `sentences`, one entry [A, ...] per sentence still searched
    ("index" [A], its row in the batch, is required), and `results`, [B, ...] for the whole
    batch. A sentence leaves once its search is over; the decoder then runs on the others.
    Subclasses implement the methods below; their docstrings here are the interface's.

    Args:
      return_attention: also keep the last decoder layer's cross-attention of each output token.
      bos_id, eos_id: the start and end tokens.
      prefix: [B, P] int32 subword ids, PAD-padded, or None: each output starts with its
        sentence's prefix (forced decoding of those tokens, scored by the model), then the
        search goes on from there.

    Example (a strategy is run, not stepped by hand):
      ids, scores = dynamic_decode(model, GreedySearch(), source_ids)
    """

    rows_per_sentence = 1

    def __init__(self, return_attention=False, bos_id=BOS_ID, eos_id=EOS_ID, prefix=None):
        self.return_attention = return_attention
        self.bos_id, self.eos_id = bos_id, eos_id
        self.prefix = None if prefix is None else tf.convert_to_tensor(prefix, tf.int32)

    def with_prefix(self, sentences):
        """The initial sentence state with the prefix added ("prefix" [B, P + 1]: a PAD
        column after it, so that it has a column at every step)."""
        if self.prefix is None:
            return sentences
        return dict(sentences, prefix=tf.pad(self.prefix, [[0, 0], [0, 1]]))

    def initialize(self, batch, limits, source_length):
        """The state before the first step.

        Args:
          batch: B, the number of sentences.
          limits: [B] int32, each output's longest length.
          source_length: S, the padded source length.

        Returns:
          (sentences, results).
        """
        raise NotImplementedError

    def last_tokens(self, sentences):
        """The token each hypothesis row ends with (the decoder's next input).

        Args:
          sentences: the sentences' state.

        Returns:
          [A * rows_per_sentence] int32.
        """
        raise NotImplementedError

    def step(self, step, log_probs_of, attention, sentences, results):
        """One search step.

        Args:
          step: the time step.
          log_probs_of: a `StepLogProbs`: called with `count`, each row's `count` best
            (log-probabilities, token ids), each [R, count]; `.of(tokens)`, the
            log-probabilities of given tokens.
          attention: the last layer's cross-attention [R, S], or None.
          sentences, results: the state.

        Returns:
          (sentences, results, parents [A, rows_per_sentence]: the row of its sentence that each new
          hypothesis extends, staying [A] bool: the sentences whose search goes on).
        """
        raise NotImplementedError

    def leave(self, results, left, length):
        """Records the search of sentences that leave.

        Args:
          results: the whole batch's results.
          left: the leaving sentences' state (a gather of `sentences`).
          length: the steps their search took.

        Returns:
          The results with theirs recorded.
        """
        return results

    def finalize(self, results, batch, source_length):
        """The search's outputs.

        Args:
          results: the whole batch's results.
          batch: B.
          source_length: S.

        Returns:
          The strategy's outputs (see the subclass).
        """
        raise NotImplementedError


def dynamic_decode(model, strategy, source_ids, max_length=None):
    """Runs `strategy` on source_ids [B, S]: encodes them, then steps the decoder one position
    at a time over every hypothesis of the sentences still searched, with their keys and values
    in a `kv_cache.DecoderCache`, until every sentence has left (each leaves at the latest at
    its limit, `decode_limits`). Works eagerly and inside tf.function (one tf.while_loop).

    Args:
      model: a `Transformer` (its `encode`, `initial_cache`, `decode_step`,
        `decoding_products`, `settings`).
      strategy: a `DecodingStrategy` (`GreedySearch`, `BeamSearch`).
      source_ids: [B, S] int32, PAD-padded, EOS-terminated.
      max_length: output limit, a scalar or [B] (`decode_limits`).

    Returns:
      What `strategy.finalize` returns.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    batch, source_length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    rows_per_sentence = strategy.rows_per_sentence
    limits = decode_limits(model, source_ids, max_length)  # [B]
    memory, source_padding = model.encode(source_ids, training=False)
    cache = kv_cache.DecoderCache(model, memory, source_padding, batch * rows_per_sentence,
                                  max_length=tf.reduce_max(tf.concat([limits, [1]], 0)),
                                  groups=rows_per_sentence)
    sentences, results = strategy.initialize(batch, limits, source_length)

    def not_done(step, sentences, results, cache_state):
        return tf.size(sentences["index"]) > 0

    def one_step(step, sentences, results, cache_state):
        active = tf.shape(sentences["index"])[0]
        row_slots = tf.reshape(sentences["index"][:, None] * rows_per_sentence
                               + tf.range(rows_per_sentence), [-1])  # [A * K]
        caches, cache_state = cache.for_step(cache_state, step, row_slots)
        out = model.decode_step(strategy.last_tokens(sentences)[:, None], step, caches,
                                cache_state["source_padding"],
                                return_attention=strategy.return_attention,
                                # asked only where sliced: a model wrapper may not take it
                                **({"logit_slices": True} if logit_slices > 1 else {}))
        logits, caches = out[0], out[1]  # [A * K, V], or its slices along V
        cache_state = cache.update(cache_state, caches)
        sentences, results, parents, staying = strategy.step(
            step, StepLogProbs(logits),
            out[2] if strategy.return_attention else None, sentences, results)
        leaving = tf.cast(tf.where(tf.logical_not(staying))[:, 0], tf.int32)
        staying = tf.cast(tf.where(staying)[:, 0], tf.int32)  # [A']
        parent_rows = tf.gather(parents + tf.range(active)[:, None] * rows_per_sentence,
                                staying)  # [A', K]
        cache_state = cache.reorder(cache_state, row_slots, tf.reshape(parent_rows, [-1]),
                                    staying)

        def some_leave():
            left = tf.nest.map_structure(lambda t: tf.gather(t, leaving), sentences)
            return (strategy.leave(results, left, step + 1),
                    tf.nest.map_structure(lambda t: tf.gather(t, staying), sentences))

        results, sentences = tf.cond(tf.size(staying) < active, some_leave,
                                     lambda: (results, sentences))
        return step + 1, sentences, results, cache_state

    loop_vars = (tf.constant(0), sentences, results, cache.state)
    # What the steps multiply by, prepared once; the output layer in `logit_slices` products.
    with model.decoding_products() as logit_slices:
        _, _, results, _ = tf.while_loop(not_done, one_step, loop_vars,
                                         shape_invariants=loop_shape_invariants(loop_vars))
    return strategy.finalize(results, batch, source_length)
