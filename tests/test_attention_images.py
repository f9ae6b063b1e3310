import os

import numpy as np
import pytest

from tfnmt.data import vocabulary
from tfnmt.data.special_tokens import BOS_ID
from tfnmt.inference.evaluation import Translator
from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer
from tfnmt.paths import VOCAB
from tfnmt.training.attention_images import labelled_heads
from tfnmt.training.evaluator import attention_inputs
from tfnmt.training.summaries import attention_pictures, teacher_forced_inputs

CELL, GAP = 10, 3


def weights(heads=3, rows=4, cols=5, seed=0):
    return np.random.default_rng(seed).dirichlet(np.ones(cols), size=(heads, rows))


def test_cells_show_each_heads_weights_scaled_to_its_maximum():
    w = weights()
    image = labelled_heads(w, [""] * 4, [""] * 5, cell=CELL, gap=GAP)
    # Empty labels: the heatmaps start 4 pixels from the left and from the top.
    left = top = 4
    assert image.shape == (top + 4 * CELL + CELL + 4, left + 3 * 5 * CELL + 2 * GAP, 3)
    for h in range(3):
        scaled = w[h] / w[h].max()
        for i in range(4):
            for j in range(5):
                y = top + i * CELL + CELL // 2
                x = left + h * (5 * CELL + GAP) + j * CELL + CELL // 2
                expected = np.round(255 * (1 - scaled[i, j] * np.array([0.9, 0.7, 0.3])))
                np.testing.assert_allclose(image[y, x].astype(int), expected, atol=1)


def test_heads_are_parted_by_a_grey_line():
    image = labelled_heads(weights(), [""] * 4, [""] * 5, cell=CELL, gap=GAP)
    for h in (1, 2):
        x = 4 + h * (5 * CELL + GAP) - GAP + GAP // 2
        assert (image[:, x] == [96, 96, 96]).all()
        assert (image[4 + CELL // 2, x - 1] != [96, 96, 96]).any()  # a heatmap cell beside it


def test_tokens_are_written_beside_their_rows_and_above_their_columns():
    rows, cols = ["<s>", "", "\u2581house", ""], ["\u2581Das", "", "\u2581Haus", "", "</s>"]
    image = labelled_heads(weights(), rows, cols, cell=CELL, gap=GAP)
    blank = labelled_heads(weights(), [""] * 4, [""] * 5, cell=CELL, gap=GAP)
    left = image.shape[1] - blank.shape[1] + 4
    top = image.shape[0] - blank.shape[0] + 4
    assert left > 4 and top > 4  # room was made for the labels
    for i, token in enumerate(rows):
        band = image[top + i * CELL + 2:top + (i + 1) * CELL - 2, :left - 1]
        assert (band.min() < 128) == bool(token), (i, token)
    for h in range(3):
        for j, token in enumerate(cols):
            x = left + h * (5 * CELL + GAP) + j * CELL
            band = image[:top - 1, x + 2:x + CELL - 2]
            assert (band.min() < 128) == bool(token), (h, j, token)


def test_mismatched_tokens_are_refused():
    with pytest.raises(ValueError, match="4 x 5 positions for 3 query"):
        labelled_heads(weights(), ["a"] * 3, ["b"] * 5)


def test_the_pictured_dev_pair_fits_a_learned_position_table(small_prepared):
    # A model with 12 learned positions and a dev pair of more pieces than that on each side:
    # the evaluation's pictures are cut to the table (the embedding's gather would fail past
    # its last row, and with it the run's evaluation).
    path = os.path.join(small_prepared, VOCAB)
    vocab = vocabulary.Vocabulary(path, path)
    model = Transformer(vocab_size=600, **dict(get_preset("tiny", dropout=0.0),
                                               position="learned", max_length=12))
    model.build()
    pair = ("Und Gott sprach: Es werde Licht! Und es ward Licht, und Gott sah das Licht.",
            "And God said, Let there be light: and there was light. And God saw the light.")
    assert min(len(vocab.source.tokenize([pair[0]])[0]),
               len(vocab.target.tokenize([pair[1]])[0])) > 12
    source_ids, target_in = attention_inputs([pair], Translator(model, vocab), model.max_length)
    assert source_ids.shape == (1, 12) and target_in.shape == (1, 12)
    assert target_in[0, 0] == BOS_ID
    # translate.py --plot_attention: a translation tokenized again, past the table too.
    source_ids, target_in = teacher_forced_inputs(
        Translator(model, vocab, max_source_length=40).source_ids([pair[0]]),
        vocab.target.tokenize([pair[1] + " " + pair[1]]), model.max_length)
    assert source_ids.shape == (1, 12) and target_in.shape == (1, 12)
    pictures = attention_pictures(model, source_ids, target_in, vocab.source.id_to_piece,
                                  vocab.target.id_to_piece)
    assert len(pictures) == 6 and all(p.ndim == 3 and p.shape[2] == 3
                                      for p in pictures.values())
