import numpy as np
import pytest
import tensorflow as tf

from helpers import run_layer_test
from tfnmt.layers import Dropout
from tfnmt.layers.dropout import dropout, dropout_keep_mask


def test_inference_and_rate_zero_are_identity():
    x = tf.random.normal([4, 8])
    assert Dropout(0.3)(x, training=False) is x
    assert Dropout(0.0)(x, training=True) is x


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_drop_rate_and_scale(dtype):
    x = tf.ones([512, 1024], dtype)
    y = Dropout(0.1, seed=3, dtype=dtype.name)(x, training=True)
    assert y.dtype == dtype
    y = tf.cast(y, tf.float32).numpy()
    kept = y != 0
    keep_probability = 1 - 6554 / 65536  # round(0.1 * 2^16) of 2^16 levels are dropped
    # 524,288 draws: 5 standard deviations of the dropped fraction is 0.0021.
    assert abs((1 - kept.mean()) - 0.1) < 0.0021
    expected = np.float32(tf.cast(tf.constant(1 / keep_probability, dtype), tf.float32))
    np.testing.assert_array_equal(y[kept], expected)


def test_masks_differ_between_calls_and_elements_are_independent():
    layer = Dropout(0.5, seed=1)
    x = tf.ones([64, 128])
    first = layer(x, training=True).numpy() != 0
    second = layer(x, training=True).numpy() != 0
    assert (first != second).mean() > 0.4  # two independent masks disagree on half
    # The two 16-bit halves of one 32-bit draw must not be correlated.
    pairs = first.reshape(-1, 2)
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 0.05


def test_same_seed_same_mask_and_odd_sizes():
    seed = tf.constant([7, 9], tf.int32)
    a = dropout_keep_mask([3, 5, 7], 0.25, seed)
    assert a.shape == (3, 5, 7)
    np.testing.assert_array_equal(a, dropout_keep_mask([3, 5, 7], 0.25, seed))
    assert dropout_keep_mask([0, 4], 0.25, seed).shape == (0, 4)


@pytest.mark.parametrize("rate", [0.1, 0.5, "first element's bits"])
def test_mask_follows_the_documented_rule(rate):
    # Element i is dropped when its 16 bits (the i-th uint16 of the 32-bit draws, little-endian
    # halves in order) fall below round(rate * 2^16): rebuilt in numpy from the same draws.
    seed = tf.constant([4, 2], tf.int32)
    shape = [5, 7]  # 35 elements: 18 draws, the last half unused
    bits = tf.random.stateless_uniform([18], seed, minval=None, maxval=None, dtype=tf.uint32)
    halves = bits.numpy().astype("<u4").view("<u2")[:35]
    if isinstance(rate, str):  # the threshold equal to the first element's bits: it is kept
        rate = halves[0] / 65536
    expected = (halves >= round(rate * 65536)).reshape(shape)
    np.testing.assert_array_equal(dropout_keep_mask(shape, rate, seed), expected)


def test_gradient_is_the_same_mask():
    x = tf.random.normal([32, 16])
    seed = tf.constant([1, 2], tf.int32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = dropout(x, 0.2, seed)
    grad = tape.gradient(y, x)
    np.testing.assert_allclose(grad * x, y, rtol=1e-6)  # dy/dx = mask · scale


def test_inside_tf_function_with_unknown_shape():
    layer = Dropout(0.1, seed=0)
    fn = tf.function(lambda x: layer(x, training=True),
                     input_signature=[tf.TensorSpec([None, None, 8])])
    assert fn(tf.ones([2, 3, 8])).shape == (2, 3, 8)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="below 1"):
        Dropout(1.0)
    with pytest.raises(ValueError, match="noise_shape"):
        Dropout(0.1, noise_shape=(1, None))


def test_layer_contract():
    run_layer_test(Dropout, dict(rate=0.2, seed=4), (tf.random.normal([2, 3]),))
