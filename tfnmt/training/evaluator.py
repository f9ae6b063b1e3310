"""The dev evaluation during training: loss, perplexity, sacreBLEU/chrF of greedy (or beam)
translations, sample translations and attention images for TensorBoard."""
import tensorflow as tf

from tfnmt.data import pipeline
from tfnmt.data.corpus import read_split
from tfnmt.inference import bleu_tokenization, search_memory
from tfnmt.inference.evaluation import Translator, evaluate_loss, loss_sums_function
from tfnmt.inference.sacrebleu_scores import corpus_scores
from tfnmt.training.summaries import (teacher_forced_inputs, write_attention_images,
                                     write_scalars)

ATTENTION_LENGTH = 40  # positions of the attention pictures, at most


def attention_pair(pairs, words=(6, 16)):
    """The dev pair the attention pictures show: the first whose source and reference both have
    words[0] to words[1] words (short enough to read), else the first pair."""
    for source, reference in pairs:
        if all(words[0] <= len(text.split()) <= words[1] for text in (source, reference)):
            return source, reference
    return pairs[0]


def attention_inputs(pairs, translator, max_length):
    """The model inputs of the dev pair the attention pictures show (`attention_pair`), cut to
    ATTENTION_LENGTH positions and to the model's `max_length` (a learned position table has
    no more rows).

    Args:
      pairs: (source, reference) strings.
      translator: the evaluation's `Translator` (its vocabulary tokenizes both sides).
      max_length: the model's positions.

    Returns:
      (source_ids [1, S], target_in [1, T]): S, T <= min(ATTENTION_LENGTH, max_length).
    """
    source, reference = attention_pair(pairs)
    return teacher_forced_inputs(translator.source_ids([source]),
                                 translator.vocabulary.target.tokenize([reference]),
                                 min(ATTENTION_LENGTH, max_length))


def run_bleu_tokenization(settings, dev_pairs=None):
    """The sacreBLEU tokenization of a run's BLEU scores: train.py's --bleu_tokenize, or for
    `auto` the one that fits the script of the dev references (`bleu_tokenization.detect`).

    Args:
      settings: the run's settings.
      dev_pairs: the dev split's (source, reference) pairs, if already read.

    Returns:
      (tokenization, why): why is "" unless `auto` chose something other than 13a.
    """
    pairs = read_split(settings["data"], "dev") if dev_pairs is None else dev_pairs  # lazy
    chosen = (settings.get("train") or {}).get("bleu_tokenize", bleu_tokenization.AUTO)
    return bleu_tokenization.resolve(chosen, (reference for _, reference in pairs))


class Evaluator:
    """Evaluates a training model on the dev split.

    Args:
      model: the `Transformer` being trained.
      vocabulary: its `vocabulary.Vocabulary`.
      settings: the run's settings (data, train sections).
      data_dir: the prepared data (the dev split's TFRecords).
      no_repeat_ngram_size: N > 0: with `eval_beam_size` > 1, the beam search repeats no
        sequence of N subwords (train.py's rule for the end of the run); greedy evaluations
        take no rule.

    Calling it with a step (and a `tf.summary` writer) returns {loss, perplexity, accuracy,
    bleu, chrf} and writes them, four sample translations and attention images. BLEU uses the
    run's tokenization (`run_bleu_tokenization`; `bleu_tokenize` and `bleu_tokenize_why`).
    """

    def __init__(self, model, vocabulary, settings, data_dir, no_repeat_ngram_size=0):
        self.model = model
        self.settings = settings
        d = settings["data"]
        self.data_dir = data_dir
        self.pairs = list(read_split(d, "dev"))
        self.bleu_tokenize, self.bleu_tokenize_why = run_bleu_tokenization(settings, self.pairs)
        limit = settings["train"].get("bleu_sentences") or len(self.pairs)
        self.pairs = self.pairs[:limit]
        self.translator = Translator(model, vocabulary, d["max_length"],
                                     beam_size=settings["train"].get("eval_beam_size", 1),
                                     memory_budget=search_memory.memory_budget(),
                                     no_repeat_ngram_size=no_repeat_ngram_size)
        self.loss_sums = loss_sums_function(model, settings["train"]["label_smoothing"])
        self.vocabulary = vocabulary

    def __call__(self, step, writer=None):
        t = self.settings["train"]
        dev = pipeline.make_dataset(self.data_dir, "dev", t["batch_tokens"],
                                    self.settings["data"]["max_length"], shuffle=False)
        metrics = evaluate_loss(self.model, dev, sums=self.loss_sums)
        sources = [s for s, _ in self.pairs]
        hypotheses = self.translator.translate(sources)
        metrics.update(corpus_scores(hypotheses, [r for _, r in self.pairs],
                                     tokenize=self.bleu_tokenize))
        if writer is not None:
            with writer.as_default():
                write_scalars(metrics, step)
                samples = [f"**source** {s}  \n**reference** {r}  \n**translation** {h}"
                           for (s, r), h in list(zip(self.pairs, hypotheses))[:4]]
                tf.summary.text("samples/translations", tf.constant(samples), step=step,
                                description="The first dev sentences, their references and "
                                "the model's translations at this step.")
                source_ids, target_in = attention_inputs(self.pairs, self.translator,
                                                         self.model.max_length)
                write_attention_images(self.model, source_ids, target_in, step,
                                       self.vocabulary)
            writer.flush()
        return metrics
