import numpy as np
import pytest
import tensorflow as tf

from helpers import assert_config_round_trip
from tfnmt.layers import FeedForward


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matches_formula(activation):
    layer = FeedForward(8, 32, activation=activation)
    x = tf.random.normal([2, 3, 8])
    out = layer(x)
    w = {v.name: v.numpy() for v in layer.weights}
    h = x.numpy() @ w["inner_kernel"] + w["inner_bias"]
    h = np.maximum(h, 0) if activation == "relu" else tf.nn.gelu(h).numpy()
    np.testing.assert_allclose(out, h @ w["output_kernel"] + w["output_bias"], atol=1e-5)


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 32, activation="swish")


def test_config_round_trips():
    assert_config_round_trip(FeedForward(8, 16, activation="gelu"), tf.random.normal([1, 2, 8]))
