import numpy as np
import pytest

from tfnmt.training.attention_images import labelled_heads

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
