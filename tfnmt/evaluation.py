"""Validation metrics: loss and perplexity by teacher forcing; sacreBLEU and chrF on
detokenized translations (the scores papers report are on detokenized text)."""
import math

import numpy as np
import sacrebleu
import tensorflow as tf

from tfnmt.decoding import greedy_decode
from tfnmt.losses import masked_accuracy_sum, masked_loss_sum


def evaluate_loss(model, dataset, label_smoothing=0.1):
    """Over a dataset of batches: smoothed loss per token, perplexity (from the unsmoothed
    cross-entropy) and token accuracy."""
    @tf.function(reduce_retracing=True)
    def sums(batch):
        logits = model((batch["source"], batch["target_in"]), training=False)
        smoothed, tokens = masked_loss_sum(batch["target_out"], logits, label_smoothing)
        nll, _ = masked_loss_sum(batch["target_out"], logits, 0.0)
        correct, _ = masked_accuracy_sum(batch["target_out"], logits)
        return tf.stack([smoothed, nll, correct, tokens])

    totals = np.zeros(4)
    for batch in dataset:
        totals += sums(batch).numpy()
    smoothed, nll, correct, tokens = totals
    tokens = max(tokens, 1.0)
    return {"loss": smoothed / tokens, "perplexity": math.exp(min(nll / tokens, 50.0)),
            "accuracy": correct / tokens}


class Translator:
    """Batched translation of raw strings with a model and its tokenizer (greedy, cached)."""

    def __init__(self, model, tokenizer, max_source_length=None, batch_size=64):
        self.model = model
        self.tokenizer = tokenizer
        self.max_source_length = max_source_length or model.max_length
        self.batch_size = batch_size
        self._decode = tf.function(lambda source: greedy_decode(model, source),
                                   reduce_retracing=True)

    def source_ids(self, sentences):
        """Tokenized, EOS-terminated, truncated to max_source_length: [B, S] int32."""
        from tfnmt.tokenizer import EOS_ID

        ids = self.tokenizer.tokenize(sentences)[:, : self.max_source_length - 1]
        eos = tf.fill([ids.nrows(), 1], EOS_ID)
        return tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1).to_tensor()

    def translate(self, sentences):
        """List of str -> list of str, in order. Batches sentences of similar length."""
        sentences = list(sentences)
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        results = [""] * len(sentences)
        for start in range(0, len(order), self.batch_size):
            index = order[start:start + self.batch_size]
            ids, _ = self._decode(self.source_ids([sentences[i] for i in index]))
            for i, text in zip(index, self.tokenizer.detokenize(ids).numpy()):
                results[i] = text.decode("utf-8")
        return results


def corpus_scores(hypotheses, references):
    """sacreBLEU (13a tokenization, as in the sacrebleu defaults) and chrF."""
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}
