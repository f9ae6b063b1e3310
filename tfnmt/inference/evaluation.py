"""Validation metrics: loss and perplexity by teacher forcing; translation of sentences in
batches (`batching`) for sacreBLEU (`sacrebleu_scores`) to score."""
import math

import numpy as np
import tensorflow as tf

from tfnmt.data.tokenizer import to_source_ids
from tfnmt.inference.batching import translate_lines
from tfnmt.inference import search_memory
from tfnmt.inference.beam_search import beam_search
from tfnmt.inference.greedy_search import greedy_decode
from tfnmt.training.losses import masked_accuracy_sum, masked_loss_sum


def loss_sums_function(model, label_smoothing=0.1):
    """A tf.function batch -> [smoothed loss sum, nll sum, correct tokens, tokens], traced once for
    every batch shape ([None, None] ids), so an evaluation costs one trace, not one per length
    bucket; keep it to reuse that trace across evaluations.

    Args:
      model: a `Transformer`.
      label_smoothing: the smoothing of the loss sum.

    Returns:
      The function.
    """
    ids = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[{"source": ids, "target_in": ids, "target_out": ids}],
                 autograph=False)
    def sums(batch):
        logits = model((batch["source"], batch["target_in"]), training=False)
        smoothed, tokens = masked_loss_sum(batch["target_out"], logits, label_smoothing)
        nll, _ = masked_loss_sum(batch["target_out"], logits, 0.0)
        correct, _ = masked_accuracy_sum(batch["target_out"], logits)
        return tf.stack([smoothed, nll, correct, tokens])

    return sums


def evaluate_loss(model, dataset, label_smoothing=0.1, sums=None):
    """Loss, perplexity and token accuracy over a dataset.

    Args:
      model: a `Transformer`.
      dataset: batches as `pipeline.make_dataset` gives them.
      label_smoothing: the smoothing of the reported loss.
      sums: a `loss_sums_function(model, label_smoothing)` to reuse (one trace).

    Returns:
      {"loss": smoothed loss per real target token, "perplexity": exp of the unsmoothed
      cross-entropy per token, "accuracy": argmax accuracy per token}; each None when the
      dataset holds no target token (every pair longer than its max_length)."""
    sums = sums or loss_sums_function(model, label_smoothing)
    totals = np.zeros(4)
    for batch in dataset:
        totals += sums(batch).numpy()
    smoothed, nll, correct, tokens = totals
    if not tokens:
        return {"loss": None, "perplexity": None, "accuracy": None}
    return {"loss": smoothed / tokens, "perplexity": math.exp(min(nll / tokens, 50.0)),
            "accuracy": correct / tokens}


class Translator:
    """Batched translation of raw strings with a model and its vocabulary, greedy or by beam
    search (evaluation during training; the exported translator is
    `tfnmt.inference.serving.TranslationModule`).

    Args:
      model: a `Transformer`.
      vocabulary: its `vocabulary.Vocabulary` (sources are tokenized with its source side,
        translations detokenized with its target side).
      max_source_length: the longest source, EOS included (longer ones are cut); default the
        model's max_length.
      batch_size: sentences per batch in `translate`.
      beam_size: 1 for greedy search, else the beam search's width.
      alpha: the beam search's length-penalty exponent.
      memory_budget: None, or bytes a batch's beam search may hold: fewer sentences per batch
        where batch_size of the longest sources would not fit (`search_memory`).
      no_repeat_ngram_size: N > 0: the beam search repeats no sequence of N subwords (ignored
        by greedy search).

    Example:
      Translator(model, vocabulary).translate(["Das ist ein Haus."])  # ["That is a house."]
    """

    def __init__(self, model, vocabulary, max_source_length=None, batch_size=64, beam_size=1,
                 alpha=0.6, memory_budget=None, no_repeat_ngram_size=0):
        self.model = model
        self.vocabulary = vocabulary
        self.max_source_length = max_source_length or model.max_length
        self.batch_size = batch_size
        if beam_size > 1 and memory_budget is not None:
            self.batch_size = search_memory.sentences_at_once(
                model.settings, beam_size, self.max_source_length + search_memory.EXTRA_LENGTH,
                memory_budget, batch_size)

        def decode(source):  # -> ids [B, L], scores [B]
            if beam_size == 1:
                return greedy_decode(model, source)
            ids, scores = beam_search(model, source, beam_size, alpha,
                                      no_repeat_ngram_size=no_repeat_ngram_size)
            return ids[:, 0], scores[:, 0]

        # One trace for every batch shape (a search traces for seconds).
        self._decode = tf.function(decode, autograph=False,
                                   input_signature=[tf.TensorSpec([None, None], tf.int32)])

    def source_ids(self, sentences):
        """Model inputs of sentences.

        Args:
          sentences: [B] strings.

        Returns:
          [B, S] int32: tokenized, truncated, EOS-terminated, padded.
        """
        return to_source_ids(self.vocabulary.source.tokenize(sentences), self.max_source_length)

    def translate_batch(self, sentences):
        """Translates one batch.

        Args:
          sentences: [B] strings.

        Returns:
          (translations [B] tf.string, log-probabilities [B]).
        """
        ids, scores = self._decode(self.source_ids(sentences))
        return self.vocabulary.target.detokenize(ids), scores

    def translate(self, sentences):
        """Translates sentences, batching those of similar length.

        Args:
          sentences: a list of str.

        Returns:
          A list of str, in order.
        """
        return translate_lines(self.translate_batch, list(sentences), self.batch_size)
