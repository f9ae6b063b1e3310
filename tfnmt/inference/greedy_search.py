"""Greedy search and random sampling: `DecodingStrategy`s that keep one output per sentence,
each taking the most likely next token (`GreedySearch`) or a random draw (`SamplingSearch`),
driven by decoding.py's `dynamic_decode`."""
import tensorflow as tf

from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID
from tfnmt.inference.decoding import DecodingStrategy, dynamic_decode, forced_tokens, replace_rows


class GreedySearch(DecodingStrategy):
    """The most likely token at each step; a sentence leaves at EOS or at its limit.

    finalize -> (ids [B, L] without BOS, PAD after EOS; log-probabilities [B] of the output,
    EOS included; with return_attention, the last decoder layer's cross-attention averaged
    over heads [B, L, S]).

    Args: `DecodingStrategy`'s.
    """

    def initialize(self, batch, limits, source_length):
        sentences = self.with_prefix({"index": tf.range(batch), "limit": limits,
                                      "tokens": tf.fill([batch], self.bos_id)})
        results = {"ids": tf.TensorArray(tf.int32, size=0, dynamic_size=True),
                   "scores": tf.zeros([batch], tf.float32)}
        if self.return_attention:
            results["attention"] = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        return sentences, results

    def last_tokens(self, sentences):
        return sentences["tokens"]

    def choose(self, step, log_probs_of, sentences, batch):
        """The next token of each sentence still searched.

        Args:
          step: the time step.
          log_probs_of: as in `step`.
          sentences: the state ("index" [A]: each one's row in the batch).
          batch: B.

        Returns:
          (log-probabilities [A], tokens [A] int32).
        """
        best_log_probs, best_tokens = log_probs_of(1)  # [A, 1]
        return best_log_probs[:, 0], best_tokens[:, 0]

    def step(self, step, log_probs_of, attention, sentences, results):
        # The outputs are written for the whole batch at each step, PAD for sentences that left.
        active = sentences["index"]  # [A]
        batch = tf.shape(results["scores"])[0]
        log_probs, tokens = self.choose(step, log_probs_of, sentences, batch)
        if self.prefix is not None:
            prefix_tokens, forced = forced_tokens(step, sentences)
            tokens = tf.where(forced, prefix_tokens, tokens)
            log_probs = tf.where(forced, log_probs_of.of(prefix_tokens), log_probs)
        results = dict(
            results,
            scores=tf.tensor_scatter_nd_add(results["scores"], active[:, None], log_probs),
            ids=results["ids"].write(step, replace_rows(tf.fill([batch], PAD_ID), active,
                                                        tokens)))
        if attention is not None:  # [A, S]
            results["attention"] = results["attention"].write(step, replace_rows(
                tf.zeros([batch, tf.shape(attention)[1]]), active, attention))
        staying = tf.not_equal(tokens, self.eos_id) & (step + 1 < sentences["limit"])
        parents = tf.zeros_like(tokens)[:, None]  # [A, 1]: each row extends itself
        return dict(sentences, tokens=tokens), results, parents, staying

    def finalize(self, results, batch, source_length):
        ids = tf.cond(results["ids"].size() > 0, lambda: batch_major(results["ids"].stack()),
                      lambda: tf.zeros([batch, 0], tf.int32))
        if not self.return_attention:
            return ids, results["scores"]
        attention = results["attention"]
        weights = tf.cond(attention.size() > 0,
                          lambda: tf.transpose(attention.stack(), [1, 0, 2]),
                          lambda: tf.zeros([batch, 0, source_length]))
        return ids, results["scores"], weights


def batch_major(step_major):
    """[T, B] ids -> [B, T], by a gather rather than a Transpose, for which TensorFlow's oneDNN
    build logs a spurious "oneDNN supports DT_INT32 only on platforms with AVX-512" error."""
    steps, batch = tf.shape(step_major)[0], tf.shape(step_major)[1]
    flat_index = tf.range(batch)[:, None] + tf.range(steps)[None, :] * batch  # [B, T]
    return tf.gather(tf.reshape(step_major, [-1]), flat_index)


class SamplingSearch(GreedySearch):
    """Each token drawn at random from the model's distribution, sharpened or flattened by a
    temperature and optionally cut to the `top_k` most likely tokens: varied translations,
    as back-translation wants them. The draws depend only on `seed`, `search` (the search's
    number), the step and the sentence's row in the batch: the same batch, seed and search
    number give the same outputs, and searches of other numbers draw anew (so that the
    batches of one input, each a search of its own number, share no noise).

    finalize -> as `GreedySearch` (the scores are the log-probabilities of the drawn tokens
    under the model, before temperature and top-k).

    Args:
      vocab_size: the target vocabulary's size.
      temperature: > 0; the logits are divided by it (1: the model's distribution).
      top_k: draw among the k most likely tokens only (0: all of them).
      seed: the draws' seed.
      search: the search's number among those of one seed, an int or int64 scalar tensor.
      **kwargs: `DecodingStrategy`'s.
    """

    def __init__(self, vocab_size, temperature=1.0, top_k=0, seed=0, search=0, **kwargs):
        super().__init__(**kwargs)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        self.count = min(top_k, vocab_size) if top_k else vocab_size
        self.temperature, self.seed, self.search = float(temperature), int(seed), search

    def choose(self, step, log_probs_of, sentences, batch):
        log_probs, tokens = log_probs_of(self.count)  # [A, k]
        # Gumbel-max: argmax(log p / T + G) is a draw from softmax(log p / T). The noise is
        # drawn for the whole batch and gathered, so a row's draw does not depend on which
        # other sentences are still searched.
        search_seed = tf.stack([tf.constant(self.seed, tf.int64),
                                tf.cast(self.search, tf.int64)])
        uniform = tf.random.stateless_uniform(
            [batch, self.count], seed=tf.random.experimental.stateless_fold_in(search_seed, step),
            minval=1e-20, maxval=1.0)
        gumbel = -tf.math.log(-tf.math.log(tf.gather(uniform, sentences["index"])))
        pick = tf.argmax(log_probs / self.temperature + gumbel, axis=1, output_type=tf.int32)
        return (tf.gather(log_probs, pick, batch_dims=1),
                tf.gather(tokens, pick, batch_dims=1))


def sample_decode(model, source_ids, temperature=1.0, top_k=0, seed=0, max_length=None,
                  prefix=None, search=0):
    """Random sampling (`dynamic_decode` with `SamplingSearch`).

    Args:
      model: a `Transformer`.
      source_ids: [B, S] int32, PAD-padded, EOS-terminated.
      temperature, top_k, seed, search: the draws (`SamplingSearch`).
      max_length: output limit, a scalar or [B] (`decode_limits`).
      prefix: [B, P] int32 subword ids each output must start with (PAD-padded), or None.

    Returns:
      (ids [B, L] without BOS, PAD after EOS; log-probabilities [B] of the drawn outputs).
    """
    strategy = SamplingSearch(model.settings["target_vocab_size"], temperature, top_k, seed,
                              search, prefix=prefix)
    return dynamic_decode(model, strategy, source_ids, max_length)


def greedy_decode(model, source_ids, max_length=None, bos_id=BOS_ID, eos_id=EOS_ID,
                  return_attention=False, prefix=None):
    """Incremental greedy decoding (`dynamic_decode` with `GreedySearch`): a sentence stops at
    EOS or at its limit.

    Args:
      model: a `Transformer`.
      source_ids: [B, S] int32, PAD-padded, EOS-terminated.
      max_length: output limit, a scalar or [B]; default each sentence's source length + 50
        subwords (`decode_limits`).
      bos_id, eos_id: the start and end tokens.
      return_attention: also return the last decoder layer's cross-attention.
      prefix: [B, P] int32 subword ids each output must start with (PAD-padded), or None.

    Returns:
      (ids [B, L] without BOS, PAD after EOS; log-probabilities [B] of the outputs, EOS
      included; with return_attention, the cross-attention averaged over heads [B, L, S])."""
    strategy = GreedySearch(return_attention=return_attention, bos_id=bos_id, eos_id=eos_id,
                            prefix=prefix)
    return dynamic_decode(model, strategy, source_ids, max_length)
