import numpy as np
import pytest
import tensorflow as tf

from helpers import run_layer_test
from tfnmt.layers import TransformerDecoderLayer
from tfnmt.model.kv_cache import AppendCache
from tfnmt.model.transformer import causal_mask


@pytest.mark.parametrize("norm_first", [False, True])
def test_position_i_ignores_later_positions(norm_first):
    layer = TransformerDecoderLayer(16, 4, 32, norm_first=norm_first)
    memory = tf.random.normal([1, 4, 16])
    x = tf.random.normal([1, 6, 16])
    changed = tf.concat([x[:, :3], tf.random.normal([1, 3, 16])], axis=1)
    a = layer(x, memory, causal_mask(6))
    b = layer(changed, memory, causal_mask(6))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert not np.allclose(a[:, 3:], b[:, 3:])


def test_cached_steps_equal_full_decoding():
    layer = TransformerDecoderLayer(16, 4, 32)
    memory = tf.random.normal([2, 5, 16])
    memory_mask = tf.constant([[True] * 5, [True] * 3 + [False] * 2])[:, None]
    x = tf.random.normal([2, 4, 16])
    full = layer(x, memory, causal_mask(4), memory_mask)
    cache = {"self": AppendCache.empty(2, 4, 4, tf.float32), "memory": layer.memory_cache(memory)}
    for t in range(4):
        step, cache, weights = layer.call_cached(x[:, t:t + 1], cache, memory_mask,
                                                 return_attention_scores=True)
        np.testing.assert_allclose(step[:, 0], full[:, t], atol=1e-5)
        assert weights["self"].shape == (2, 4, 1, t + 1) and weights["cross"].shape == (2, 4, 1, 5)


def test_returns_self_and_cross_attention_weights():
    layer = TransformerDecoderLayer(16, 4, 32)
    _, weights = layer(tf.random.normal([2, 3, 16]), tf.random.normal([2, 5, 16]),
                       causal_mask(3), return_attention_scores=True)
    assert weights["self"].shape == (2, 4, 3, 3) and weights["cross"].shape == (2, 4, 3, 5)
    assert np.all(np.triu(weights["self"].numpy()[0, 0], k=1) == 0.0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_contract(norm_first):
    attention, ffn, norm = 4 * (16 * 16 + 16), 16 * 32 + 32 + 32 * 16 + 16, 2 * 16
    run_layer_test(TransformerDecoderLayer,
                   dict(d_model=16, num_heads=4, d_ff=32, dropout=0.3, norm_first=norm_first),
                   (tf.random.normal([2, 3, 16]), tf.random.normal([2, 4, 16]), causal_mask(3)),
                   expected_weights=2 * 8 + 4 + 3 * 2,
                   expected_parameters=2 * attention + ffn + 3 * norm)
