import numpy as np
import pytest
import tensorflow as tf

from helpers import run_layer_test
from tfnmt.layers import TransformerEncoderLayer


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_does_not_change_real_positions(norm_first):
    layer = TransformerEncoderLayer(16, 4, 32, norm_first=norm_first)
    x = tf.random.normal([1, 3, 16])
    padded = tf.concat([x, tf.random.normal([1, 4, 16])], axis=1)  # garbage at padded positions
    short = layer(x, tf.ones([1, 3], tf.bool))
    long = layer(padded, tf.constant([[True] * 3 + [False] * 4]))
    np.testing.assert_allclose(long[:, :3], short, atol=1e-5)


def test_post_norm_output_is_normalised_and_pre_norm_is_not():
    x = tf.random.normal([2, 5, 16]) * 5.0
    post = TransformerEncoderLayer(16, 4, 32, norm_first=False)(x).numpy()
    pre = TransformerEncoderLayer(16, 4, 32, norm_first=True)(x).numpy()
    np.testing.assert_allclose(post.mean(-1), 0.0, atol=1e-4)
    np.testing.assert_allclose(post.std(-1), 1.0, atol=1e-2)
    assert np.abs(pre.std(-1) - 1.0).max() > 0.5  # pre-norm keeps the raw residual stream


def test_dropout_is_active_only_in_training():
    layer = TransformerEncoderLayer(16, 4, 32, dropout=0.5)
    x = tf.random.normal([2, 5, 16])
    np.testing.assert_allclose(layer(x, training=False), layer(x, training=False))
    assert not np.allclose(layer(x, training=True), layer(x, training=False))


def test_returns_attention_weights():
    layer = TransformerEncoderLayer(16, 4, 32)
    out, weights = layer(tf.random.normal([2, 5, 16]), return_attention_scores=True)
    assert out.shape == (2, 5, 16) and weights.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(tf.reduce_sum(weights, -1), 1.0, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_contract(norm_first):
    padding = tf.constant([[True] * 3, [True, True, False]])
    run_layer_test(TransformerEncoderLayer,
                   dict(d_model=16, num_heads=4, d_ff=32, dropout=0.2, activation="gelu",
                        norm_first=norm_first),
                   (tf.random.normal([2, 3, 16]), padding), expected_weights=8 + 4 + 2 * 2,
                   expected_parameters=4 * (16 * 16 + 16) + 16 * 32 + 32 + 32 * 16 + 16
                   + 2 * 2 * 16)
