import math

import numpy as np
import pytest
import tensorflow as tf

from helpers import run_layer_test
from tfnmt.layers import PositionalEncoding, TokenEmbedding


def test_embedding_is_scaled_by_sqrt_d_model():
    layer = TokenEmbedding(10, 16)
    ids = tf.constant([[1, 2, 3]])
    out = layer(ids)
    table = layer.embeddings.numpy()
    np.testing.assert_allclose(out[0], table[[1, 2, 3]] * math.sqrt(16), rtol=1e-6)


def test_logits_use_the_transposed_embedding_matrix():
    layer = TokenEmbedding(10, 8)
    layer.build()
    hidden = tf.random.normal([2, 3, 8])
    np.testing.assert_allclose(layer.logits(hidden), hidden.numpy() @ layer.embeddings.numpy().T,
                               rtol=1e-5, atol=1e-5)


def test_sinusoids_match_the_paper_formula():
    d_model = 8
    layer = PositionalEncoding(d_model)
    out = layer(tf.zeros([1, 5, d_model])).numpy()[0]
    for pos in range(5):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert out[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
            assert out[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_start_offset_gives_the_same_encoding_as_the_full_sequence(kind):
    layer = PositionalEncoding(8, kind=kind, max_length=16)
    full = layer(tf.zeros([1, 6, 8]))
    step = layer(tf.zeros([1, 1, 8]), start=4)
    np.testing.assert_allclose(step[0, 0], full[0, 4], atol=1e-6)
    # A decoding step's encoding of one position, in a graph with the position a tensor.
    at = tf.function(layer.at)
    for position in (0, 4, 5):
        np.testing.assert_allclose(at(tf.constant(position)), full[0, position], atol=1e-6)


def test_bad_position_settings_are_refused():
    with pytest.raises(ValueError, match="kind"):
        PositionalEncoding(8, kind="rotary")
    with pytest.raises(ValueError, match="even"):
        PositionalEncoding(7)


def test_layer_contract():
    run_layer_test(TokenEmbedding, dict(vocab_size=10, d_model=8), (tf.constant([[1, 2, 7]]),),
                   expected_weights=1, expected_parameters=10 * 8)
    run_layer_test(PositionalEncoding, dict(d_model=8, kind="learned", max_length=12),
                   (tf.random.normal([2, 3, 8]),), expected_weights=1,
                   expected_parameters=12 * 8)
    run_layer_test(PositionalEncoding, dict(d_model=8), (tf.random.normal([2, 3, 8]),))
