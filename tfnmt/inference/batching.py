"""Sentences translated in batches of similar length (less padding), by any translator:
TensorFlow's, or CTranslate2's (no TensorFlow imported here)."""
import numpy as np


def in_length_order(process, items, batch_size=32, length=len):
    """Applies `process` to batches of items of similar length (less padding), in order of
    length; returns its outputs in item order.

    Args:
      process: a function list of items [B] -> one output per item.
      items: a list.
      batch_size: items per call.
      length: an item's length, for batching.

    Returns:
      A list: the output of items[i] at i.

    Raises:
      ValueError: batch_size < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    order = sorted(range(len(items)), key=lambda i: length(items[i]))
    outputs = [None] * len(items)
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        for i, output in zip(index, process([items[i] for i in index]), strict=True):
            outputs[i] = output
    return outputs


def translate_lines(translate_batch, lines, batch_size=32, length=len):
    """Translates sentences in batches of similar length.

    Args:
      translate_batch: a function string [B] -> (translations string [B] tensor or numpy
        array, scores).
      lines: a list of str (or of other items `translate_batch` takes a list of).
      batch_size: sentences per call.
      length: an item's length, for batching.

    Returns:
      The translations, a list of str in input order.

    Raises:
      ValueError: batch_size < 1.
    """
    def texts(batch):
        translations, _ = translate_batch(batch)
        return [text.decode("utf-8") for text in np.asarray(translations)]

    return in_length_order(texts, lines, batch_size, length)
