import numpy as np
import pytest
import tensorflow as tf

from tfnmt.training.losses import (label_smoothed_cross_entropy, label_smoothed_loss,
                                   masked_accuracy_sum, masked_loss_sum, masked_projected_loss_sum,
                                   projected_cross_entropy)


def numpy_reference(labels, logits, epsilon, pad_id=0):
    """Smoothed target as in the Annotated Transformer, then cross-entropy, mean over tokens."""
    vocab = logits.shape[-1]
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            y = labels[b, t]
            if y == pad_id:
                continue
            target = np.full(vocab, epsilon / (vocab - 2))
            target[pad_id] = 0.0
            target[y] = 1.0 - epsilon
            total += -(target * log_probs[b, t]).sum()
            count += 1
    return total / count, count


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_matches_numpy_reference_with_padding(epsilon):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype("float32") * 3
    labels = rng.integers(1, 11, size=(3, 5)).astype("int32")
    labels[0, 3:] = 0
    labels[2, 1:] = 0
    expected, count = numpy_reference(labels, logits, epsilon)
    total, tokens = masked_loss_sum(tf.constant(labels), tf.constant(logits), epsilon)
    assert float(tokens) == count == 9
    assert float(total) / float(tokens) == pytest.approx(expected, rel=1e-5)
    assert float(label_smoothed_loss(labels, logits, epsilon)) == pytest.approx(expected, rel=1e-5)


def test_padding_logits_do_not_matter():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 7)).astype("float32")
    labels = np.array([[3, 4, 0, 0], [5, 0, 0, 0]], "int32")
    per_token, weights = label_smoothed_cross_entropy(labels, logits)
    changed = logits.copy()
    changed[0, 2:] = 100.0
    changed[1, 1:] = -100.0
    per_token_2, _ = label_smoothed_cross_entropy(labels, changed)
    np.testing.assert_allclose(per_token, per_token_2)
    np.testing.assert_array_equal(weights, (labels != 0).astype("float32"))


def test_loss_sums_add_up_across_shards():
    """Summing per-replica sums and dividing by the global count = the whole-batch mean."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 6, 9)).astype("float32")
    labels = rng.integers(1, 9, size=(4, 6)).astype("int32")
    labels[0, 2:] = 0  # shards with different token counts: a mean of means would be wrong
    whole = float(label_smoothed_loss(labels, logits))
    parts = [masked_loss_sum(labels[i:i + 2], logits[i:i + 2]) for i in (0, 2)]
    total = sum(float(p[0]) for p in parts) / sum(float(p[1]) for p in parts)
    assert total == pytest.approx(whole, rel=1e-6)


def test_accuracy_ignores_padding():
    logits = np.zeros((1, 3, 5), "float32")
    logits[0, 0, 2] = logits[0, 1, 4] = logits[0, 2, 1] = 1.0
    correct, tokens = masked_accuracy_sum(tf.constant([[2, 3, 0]]), tf.constant(logits))
    assert (float(correct), float(tokens)) == (1.0, 2.0)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_closed_form_gradient_matches_autodiff_of_the_formula(epsilon):
    rng = np.random.default_rng(3)
    logits = tf.constant(rng.normal(size=(2, 6, 13)) * 4, tf.float32)
    labels = tf.constant(rng.integers(0, 13, size=(2, 6)), tf.int32)  # includes padding (0)
    per_token_scale = tf.constant(rng.uniform(0.5, 2.0, size=(2, 6)), tf.float32)

    def reference(logits):
        log_probs = tf.nn.log_softmax(logits)
        target = tf.one_hot(labels, 13, on_value=1.0 - epsilon, off_value=epsilon / 11)
        target *= tf.one_hot(0, 13, on_value=0.0, off_value=1.0)  # no mass on padding
        weights = tf.cast(labels != 0, tf.float32)
        return -tf.reduce_sum(target * log_probs, -1) * weights

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours = label_smoothed_cross_entropy(labels, logits, epsilon)[0]
        theirs = reference(logits)
        ours_total = tf.reduce_sum(ours * per_token_scale)
        theirs_total = tf.reduce_sum(theirs * per_token_scale)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(tape.gradient(ours_total, logits),
                               tape.gradient(theirs_total, logits), atol=1e-6)


@pytest.mark.parametrize("projected", [False, True])
def test_rows_of_extreme_logits_take_the_shifted_statistics(projected):
    """Rows whose log-sum of exp(z) lies beyond ±NORMALISER_RANGE (exp overflows, or the row
    underflows) are shifted by their max: the loss against float64 numpy, the gradient against
    autodiff of log_softmax, beside rows summed as they are."""
    rng = np.random.default_rng(5)
    vocab, dim = 13, 6
    labels = tf.constant(rng.integers(1, vocab, size=(6,)), tf.int32)
    hidden = rng.normal(size=(6, dim))
    hidden[1] *= 60.0  # logits in the hundreds: exp overflows
    hidden[4] *= 40.0
    hidden = tf.constant(hidden, tf.float32)
    kernel = tf.constant(rng.normal(size=(vocab, dim)), tf.float32)
    shift = tf.constant([[0.0], [0.0], [-300.0], [0.0], [0.0], [0.0]])  # row 2 underflows

    def logits_of(hidden):
        return tf.matmul(hidden, kernel, transpose_b=True) + shift

    def reference(hidden):
        log_probs = tf.nn.log_softmax(logits_of(hidden))
        target = tf.one_hot(labels, vocab, on_value=0.9, off_value=0.1 / (vocab - 2))
        target *= tf.one_hot(0, vocab, on_value=0.0, off_value=1.0)
        return -tf.reduce_sum(target * log_probs, -1)

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(hidden)
        if projected:  # the shift as a kernel column against a constant input column
            ours = projected_cross_entropy(labels, tf.concat([hidden, -shift], 1),
                                           tf.concat([kernel, -tf.ones([vocab, 1])], 1), 0.1)
        else:
            ours = label_smoothed_cross_entropy(labels[None], logits_of(hidden)[None], 0.1)[0][0]
        theirs = reference(hidden)
    logits64 = logits_of(hidden).numpy().astype(np.float64)
    assert np.abs(logits64).max() > 150 and logits64[2].max() < -250
    expected = [numpy_reference(labels.numpy()[i:i + 1, None], logits64[i:i + 1, None], 0.1)[0]
                for i in range(6)]
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(tape.gradient(ours, hidden), tape.gradient(theirs, hidden),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("real_rows_only", [True, False])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_projected_loss_matches_logits_path(epsilon, real_rows_only):
    """The training loss (projection inside the custom gradient, of the real rows only or of
    all) gives the value and the hidden and kernel gradients of projecting first and using
    the logits loss; padding rows get a zero gradient."""
    rng = np.random.default_rng(3)
    vocab, dim = 13, 6
    labels = tf.constant(rng.integers(1, vocab, size=(4, 5)), tf.int32)
    labels = tf.tensor_scatter_nd_update(labels, [[0, 4], [2, 3], [2, 4]], [0, 0, 0])  # padding
    labels = tf.tensor_scatter_nd_update(labels, [[1, 0]], [vocab - 1])
    hidden = tf.constant(rng.normal(size=(4, 5, dim)), tf.float32)
    kernel = tf.Variable(rng.normal(size=(vocab, dim)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(hidden)
        ours, ours_count = masked_projected_loss_sum(labels, hidden, kernel, epsilon,
                                                     real_rows_only=real_rows_only)
        logits = tf.einsum("btd,vd->btv", hidden, kernel)
        theirs, theirs_count = masked_loss_sum(labels, logits, epsilon)
    assert float(ours_count) == float(theirs_count) == 17.0
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    ours_grads = tape.gradient(ours, [hidden, kernel])
    for ours_grad, theirs_grad in zip(ours_grads, tape.gradient(theirs, [hidden, kernel])):
        np.testing.assert_allclose(tf.convert_to_tensor(ours_grad), theirs_grad, atol=1e-5)
    np.testing.assert_array_equal(tf.convert_to_tensor(ours_grads[0])[labels == 0], 0.0)


def test_projected_loss_in_bfloat16_stays_close():
    """bfloat16 states: float32 statistics, exact label/pad columns; close to float32."""
    rng = np.random.default_rng(4)
    labels = tf.constant(rng.integers(1, 50, size=(64,)), tf.int32)
    hidden = tf.constant(rng.normal(size=(64, 16)), tf.float32)
    kernel = tf.Variable(rng.normal(0, 0.5, size=(50, 16)).astype("float32"))
    results = {}
    for dtype in (tf.float32, tf.bfloat16):
        states = tf.cast(hidden, dtype)
        with tf.GradientTape() as tape:
            tape.watch(states)
            loss = tf.reduce_sum(projected_cross_entropy(labels, states, kernel, 0.1))
        grads = tape.gradient(loss, [states, kernel])
        assert loss.dtype == tf.float32 and grads[0].dtype == dtype
        results[dtype] = [loss] + [tf.cast(g, tf.float32) for g in grads]
    for got, expected in zip(results[tf.bfloat16], results[tf.float32]):
        scale = float(tf.reduce_max(tf.abs(expected)))
        np.testing.assert_allclose(got, expected, atol=0.02 * scale)
