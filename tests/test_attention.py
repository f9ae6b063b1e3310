import numpy as np
import pytest
import tensorflow as tf

from helpers import run_layer_test
from tfnmt.layers import MultiHeadAttention
from tfnmt.layers.attention import _small_matmul
from tfnmt.model.kv_cache import AppendCache


def reference_attention(layer, query, value, mask):
    """NumPy multi-head attention from the layer's own weights."""
    w = {v.name: v.numpy() for v in layer.weights}
    h, dh = layer.num_heads, layer.head_dim

    def split(x):  # [B, T, D] -> [B, H, T, Dh]
        return x.reshape(x.shape[0], x.shape[1], h, dh).transpose(0, 2, 1, 3)

    q = split(query @ w["query_kernel"] + w["query_bias"])
    k = split(value @ w["key_kernel"] + w["key_bias"])
    v = split(value @ w["value_kernel"] + w["value_bias"])
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    logits = np.where(mask[:, None], logits, -1e9)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], -1)
    return out @ w["output_kernel"] + w["output_bias"], weights


def test_matches_numpy_reference_with_padding_mask():
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    query = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    value = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    mask = np.ones((2, 1, 5), bool)
    mask[1, :, 3:] = False  # second example: two padded keys
    out, weights = layer(query, value, mask, return_attention_scores=True)
    expected_out, expected_weights = reference_attention(layer, query, value, mask)
    np.testing.assert_allclose(out, expected_out, atol=1e-5)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-6)
    assert np.all(weights.numpy()[1, :, :, 3:] == 0.0)


@pytest.mark.parametrize("given_groups", [False, True])
@pytest.mark.parametrize("query_length,per_query_mask",
                         [(None, False), (1, False), (3, False), (3, True)])
def test_static_cache_shared_by_groups_of_queries(query_length, per_query_mask, given_groups):
    # A cache row per sentence, queried by its 3 beams: same as repeating the cache per beam.
    # given_groups: the memory says 3 (as a search's does), else the layer infers it from the
    # shapes. query_length None: one query per row, [B, D], as a decoding step gives it.
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    rows = query_length is None
    query_length = query_length or 1
    query, memory = tf.random.normal([2 * 3, query_length, 8]), tf.random.normal([2, 5, 8])
    mask = np.ones((2, query_length if per_query_mask else 1, 5), bool)  # per sentence
    mask[1, :, 2:] = False
    if per_query_mask:
        mask[0, -1, 1:] = False  # the last query of the first sentence's beams: key 0 only
    shared = layer.project_key_value(memory)
    repeated = tf.nest.map_structure(lambda t: tf.repeat(t, 3, axis=0), shared)
    out, weights = layer.call_memory(query[:, 0] if rows else query,
                                     dict(shared, groups=3) if given_groups else shared, mask,
                                     return_attention_scores=True)
    expected, expected_weights = layer.call_memory(query, repeated, np.repeat(mask, 3, axis=0),
                                                   return_attention_scores=True)
    np.testing.assert_allclose(out, expected[:, 0] if rows else expected, atol=1e-6)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-6)
    assert np.all(weights.numpy()[3:, :, :, 2:] == 0.0)  # the second sentence's beams
    if per_query_mask:
        # All of the weight on key 0 (a softmax over one unmasked key: 1 up to rounding, which
        # differs between kernels), none on the masked ones (exp of -1e9 underflows to 0).
        np.testing.assert_allclose(weights.numpy()[:3, :, -1, 0], 1.0, rtol=0, atol=1e-6)
        assert np.all(weights.numpy()[:3, :, -1, 1:] == 0.0)
        np.testing.assert_array_equal(weights.numpy()[:3, :, 0, 1:] > 0, True)
    if given_groups:
        # The queries regroup by a gather of constant indices: no index arithmetic per step.
        spec = tf.TensorSpec([None, 8] if rows else [None, query_length, 8], tf.float32)
        step = tf.function(lambda q: layer.call_memory(q, dict(shared, groups=3), mask)[0])
        ops = {op.type for op in step.get_concrete_function(spec).graph.get_operations()}
        assert "GatherV2" in ops and not ops & {"Range", "FloorDiv"}
        assert not rows or "Shape" not in ops  # a decoding step's [B, D]: no shape arithmetic


def test_cached_steps_equal_causal_full_attention():
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    x = tf.random.normal([2, 4, 8])
    causal = tf.linalg.band_part(tf.ones([4, 4], tf.bool), -1, 0)[None]
    full = layer(x, x, causal)
    cache = AppendCache.empty(2, 2, 4, tf.float32)
    for t in range(4):
        step, cache, weights = layer.call_cached(x[:, t:t + 1], cache)
        np.testing.assert_allclose(step[:, 0], full[:, t], atol=1e-5)
        assert weights.shape == (2, 2, 1, t + 1)
    assert cache.key.shape == (2, 2, 4, 4)
    # Two new positions at once need the causal mask among themselves.
    cache = AppendCache.empty(2, 2, 4, tf.float32)
    first, cache, _ = layer.call_cached(x[:, :2], cache, causal[:, :2, :2])
    rest, cache, _ = layer.call_cached(x[:, 2:], cache, causal[:, 2:, :])
    np.testing.assert_allclose(tf.concat([first, rest], 1), full, atol=1e-5)


def test_static_key_value_cache_equals_direct_cross_attention():
    layer = MultiHeadAttention(num_heads=4, d_model=8)
    query, memory = tf.random.normal([2, 3, 8]), tf.random.normal([2, 6, 8])
    direct = layer(query, memory)
    cached, weights = layer.call_memory(query, layer.project_key_value(memory))
    assert weights is None
    np.testing.assert_allclose(cached, direct, atol=1e-6)


@pytest.mark.parametrize("rows", [False, True])
def test_a_decoding_step_matches_numpy_without_softmax_transpose_or_v2_products(rows):
    # A step's query is one position: its heads move by reshapes, its softmax is Eigen's
    # exp and sum, and its two batched products are BatchMatMulV3, which oneDNN leaves to
    # Eigen (oneDNN's Softmax, Transpose and BatchMatMulV2 kernels cost more at these sizes),
    # with the same result as the reference. `rows`: the query as [B, D], one position per row,
    # as the model's decoding steps give it (the output is [B, D] too).
    layer = MultiHeadAttention(num_heads=2, d_model=8)
    rng = np.random.default_rng(3)
    history = rng.normal(size=(3, 4, 8)).astype("float32")
    query = rng.normal(size=(3, 1, 8)).astype("float32") * 4
    step_query = tf.constant(query[:, 0] if rows else query)
    as_step = (lambda x: x[:, 0]) if rows else (lambda x: x)  # the reference's output shape
    mask = np.ones((3, 1, 4), bool)
    mask[2, :, 1:] = False
    memory = layer.project_key_value(tf.constant(history))
    out, weights = layer.call_memory(step_query, memory, mask, return_attention_scores=True)
    expected, expected_weights = reference_attention(layer, query, history, mask)
    np.testing.assert_allclose(out, as_step(expected), atol=1e-5)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-6)
    cache = AppendCache(memory["key"], memory["value"])
    out, _, weights = layer.call_cached(step_query, cache)
    both = np.concatenate([history, query], axis=1)  # the history, then the step itself
    expected, expected_weights = reference_attention(layer, query, both,
                                                     np.ones((3, 1, 5), bool))
    np.testing.assert_allclose(out, as_step(expected), atol=1e-5)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-6)

    step = tf.TensorSpec([None, 8] if rows else [None, 1, 8], tf.float32)
    for function in (lambda q: layer.call_memory(q, memory, mask)[0],
                     lambda q: layer.call_cached(q, cache)[0]):
        graph = tf.function(function).get_concrete_function(step).graph
        kinds = {op.type for op in graph.get_operations()}
        assert not kinds & {"Softmax", "Transpose", "BatchMatMulV2"}, kinds
        assert "BatchMatMulV3" in kinds, kinds
    if rows:  # one position per row: self-attention needs no shape arithmetic at all
        graph = tf.function(lambda q: layer.call_cached(q, cache)[0]).get_concrete_function(
            step).graph
        kinds = {op.type for op in graph.get_operations()}
        assert not kinds & {"Shape", "Pack", "StridedSlice"}, kinds


@pytest.mark.parametrize("transpose_b", [False, True])
def test_small_matmul_is_a_v3_product_in_float32_and_v2_in_bfloat16(transpose_b):
    # A decoding step's products: BatchMatMulV3 in float32 (left to Eigen where oneDNN is on),
    # tf.matmul's BatchMatMulV2 in bfloat16 (oneDNN's native kernel); both as numpy's.
    rng = np.random.default_rng(5)
    a = rng.normal(size=(3, 2, 1, 4))
    b = rng.normal(size=(3, 2, 5, 4) if transpose_b else (3, 2, 4, 5))
    expected = a @ (b.transpose(0, 1, 3, 2) if transpose_b else b)  # float64
    for dtype, kind, tolerance in ((tf.float32, "BatchMatMulV3", 1e-5),
                                   (tf.bfloat16, "BatchMatMulV2", 5e-2)):
        inputs = [tf.constant(x, dtype) for x in (a, b)]
        product = tf.function(lambda a, b: _small_matmul(a, b, transpose_b=transpose_b))
        out = product(*inputs)
        assert out.dtype == dtype
        np.testing.assert_allclose(tf.cast(out, tf.float64), expected, rtol=tolerance,
                                   atol=tolerance * np.abs(expected).max())
        kinds = {op.type for op in product.get_concrete_function(*inputs).graph.get_operations()}
        assert kind in kinds and not kinds & {"BatchMatMulV2", "BatchMatMulV3"} - {kind}, kinds


def test_attention_dropout_drops_whole_weights_in_training_only():
    # One key: every attention weight is 1, so with identity value and output projections a
    # head's slice of the output is the key's value slice, scaled by 1 / keep probability where
    # its weight was kept and 0 where it was dropped (not element by element).
    heads, head_dim, rate = 4, 2, 0.5
    layer = MultiHeadAttention(num_heads=heads, d_model=heads * head_dim, attention_dropout=rate)
    query = np.random.default_rng(0).normal(size=(64, 8, heads * head_dim)).astype("float32")
    value = np.random.default_rng(1).normal(size=(64, 1, heads * head_dim)).astype("float32")
    layer(query, value)
    layer.value_kernel.assign(np.eye(heads * head_dim))
    layer.output_kernel.assign(np.eye(heads * head_dim))
    np.testing.assert_allclose(layer(query, value, training=False),
                               np.broadcast_to(value, query.shape), rtol=1e-6)
    out = layer(query, value, training=True).numpy().reshape(64, 8, heads, head_dim)
    kept_value = np.broadcast_to(value.reshape(64, 1, heads, head_dim) / (1 - rate), out.shape)
    kept = np.all(np.isclose(out, kept_value, rtol=1e-5), axis=-1)  # [B, Tq, H]
    dropped = np.all(out == 0, axis=-1)
    assert np.all(kept != dropped)  # each head's slice is wholly kept or wholly dropped
    assert 0.4 < dropped.mean() < 0.6  # 2,048 weights at rate 0.5: 9 standard deviations


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(num_heads=3, d_model=8)


def test_layer_contract():
    x, memory = tf.random.normal([2, 3, 8]), tf.random.normal([2, 5, 8])
    run_layer_test(MultiHeadAttention, dict(num_heads=2, d_model=8, attention_dropout=0.1),
                   (x, memory), expected_weights=8, expected_parameters=4 * (8 * 8 + 8))
