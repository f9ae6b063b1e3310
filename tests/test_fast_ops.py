"""tfnmt/fast_ops.py: the fast and the plain (stock-op) paths give the same training gradients
and search steps, both equal to references written here; the switch reaches every custom op."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import random_ids
from tfnmt import fast_ops
from tfnmt.inference.decoding import top_log_probs
from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer
from tfnmt.training.distribute import PreReducedAdam
from tfnmt.training.schedule import paper_adam
from tfnmt.training.trainer import Trainer

VOCAB = 40


def make_model(dropout=0.0, **settings):
    keras.utils.set_random_seed(5)
    model = Transformer(**dict(get_preset("tiny", dropout=dropout), vocab_size=VOCAB, **settings))
    model.build()
    return model


def make_batch(rng):
    source = random_ids(rng, 4, 7, VOCAB)
    target = random_ids(rng, 4, 6, VOCAB)
    source[1, 4:] = 0
    target[2, 3:] = 0
    target_in = np.concatenate([np.full([4, 1], 1), target[:, :-1]], axis=1)
    return {"source": tf.constant(source), "target_in": tf.constant(target_in),
            "target_out": tf.constant(target)}


def reference_gradients(model, batch, epsilon=0.1):
    """Autodiff of the per-token mean smoothed loss, written out with an explicit target q
    (1 - eps on the label, eps / (V - 2) on the others but PAD) over inference-mode logits."""
    with tf.GradientTape() as tape:
        logits = tf.cast(model((batch["source"], batch["target_in"]), training=False),
                         tf.float64)
        labels = tf.one_hot(batch["target_out"], VOCAB, dtype=tf.float64)
        others = 1.0 - labels - tf.one_hot(tf.zeros_like(batch["target_out"]), VOCAB,
                                           dtype=tf.float64)
        q = (1.0 - epsilon) * labels + epsilon / (VOCAB - 2) * others
        per_token = -tf.reduce_sum(q * tf.nn.log_softmax(logits), axis=-1)
        real = tf.cast(batch["target_out"] != 0, tf.float64)
        loss = tf.reduce_sum(per_token * real) / tf.reduce_sum(real)
    return [tf.convert_to_tensor(g).numpy() for g in
            tape.gradient(loss, model.trainable_variables)]


def trainer_gradients(model, batch):
    trainer = Trainer(model, paper_adam(model.d_model, 10, 1.0, PreReducedAdam),
                      tf.distribute.get_strategy())
    _, _, _, grads = trainer.replica_gradients([batch])
    return [g.numpy() for g in grads]


@pytest.mark.parametrize("settings", [{}, {"norm_first": True, "tie_output": False,
                                           "activation": "gelu"}])
def test_plain_and_fast_training_gradients_equal_autodiff(settings):
    model = make_model(**settings)
    batch = make_batch(np.random.default_rng(0))
    reference = reference_gradients(model, batch)
    fast = trainer_gradients(model, batch)
    with fast_ops.plain_ops():
        plain = trainer_gradients(model, batch)
    assert fast_ops.enabled()  # the scope restores the default
    largest = max(np.abs(r).max() for r in reference)
    assert largest > 1e-3
    for r, f, p in zip(reference, fast, plain):
        np.testing.assert_allclose(f, r, atol=2e-5)
        np.testing.assert_allclose(p, r, atol=2e-5)


def training_graph_ops(model, batch):
    """(custom-gradient ops, op types) of a traced loss and its gradients, dropout on."""
    trainer = Trainer(model, paper_adam(model.d_model, 10, 1.0, PreReducedAdam),
                      tf.distribute.get_strategy())

    def loss_and_gradients():
        with tf.GradientTape() as tape:
            loss = trainer._loss_sum(batch)
        return loss, tape.gradient(loss, model.trainable_variables)

    graph = tf.function(loss_and_gradients).get_concrete_function().graph
    custom = [op for op in graph.get_operations()
              if op.node_def.attr["_gradient_op_type"].s.startswith(b"CustomGradient")]
    return custom, {op.type for op in graph.get_operations()}


def test_plain_ops_reach_every_custom_op():
    # tf.custom_gradient marks its ops with a _gradient_op_type; the 16-bit dropout draws
    # uint32 bits and bitcasts them. Under plain_ops neither may remain.
    model = make_model(dropout=0.1)
    batch = make_batch(np.random.default_rng(1))
    custom, types = training_graph_ops(model, batch)
    assert len(custom) > 10 and "Bitcast" in types
    with fast_ops.plain_ops():
        custom, types = training_graph_ops(model, batch)
    assert not custom and "Bitcast" not in types
    assert types & {"StatelessRandomUniformV2", "StatelessRandomUniformFullIntV2"}


def test_plain_and_fast_top_log_probs_equal_numpy():
    logits = np.random.default_rng(2).normal(size=(5, 103)).astype(np.float32)
    logits[0, [7, 40]] = 9.0  # a tie: the lower id first
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    expected_ids = np.argsort(-log_probs, axis=-1, kind="stable")[:, :6]
    for plain in (False, True):
        with fast_ops.plain_ops(plain):
            values, ids = top_log_probs(tf.constant(logits), 6)
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_allclose(values, np.take_along_axis(log_probs, expected_ids, -1),
                                   atol=1e-5)
