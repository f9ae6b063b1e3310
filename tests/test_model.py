import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import random_ids
from tfnmt.model.presets import PAPER_PARAMETERS, count_parameters, get_preset
from tfnmt.model.transformer import Transformer

TINY = get_preset("tiny", dropout=0.0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_source_padding_does_not_change_encoder_outputs(norm_first):
    model = Transformer(vocab_size=30, norm_first=norm_first, **TINY)
    source = random_ids(np.random.default_rng(0), 2, 5, 30)
    padded = np.concatenate([source, np.zeros((2, 3), np.int32)], axis=1)
    short, _ = model.encode(source)
    long, mask = model.encode(padded)
    np.testing.assert_allclose(long[:, :5], short, atol=1e-5)
    assert mask.numpy()[:, 5:].sum() == 0
    # ... and the decoder's output does not depend on the padding either.
    target = random_ids(np.random.default_rng(1), 2, 4, 30)
    np.testing.assert_allclose(model((padded, target)), model((source, target)), atol=1e-4)


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_decoder_output_at_i_ignores_later_target_tokens(position):
    model = Transformer(vocab_size=30, position=position, **TINY)
    rng = np.random.default_rng(0)
    source, target = random_ids(rng, 2, 5, 30), random_ids(rng, 2, 6, 30)
    changed = target.copy()
    changed[:, 3:] = random_ids(rng, 2, 3, 30)
    a, b = model((source, target)), model((source, changed))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert not np.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decode_steps_equal_teacher_forcing(norm_first):
    model = Transformer(vocab_size=30, norm_first=norm_first, **TINY)
    rng = np.random.default_rng(0)
    source, target = random_ids(rng, 2, 5, 30), random_ids(rng, 2, 4, 30)
    full = model((source, target))
    memory, padding = model.encode(source)
    cache = model.initial_cache(memory)
    for t in range(4):
        logits, cache = model.decode_step(target[:, t:t + 1], t, cache, padding)
        np.testing.assert_allclose(logits, full[:, t], atol=1e-4)


def test_shared_vocabulary_ties_one_variable():
    model = Transformer(vocab_size=50, **TINY)
    model.build()
    assert model.source_embedding is model.target_embedding and model.output_projection is None
    # One variable in the whole model has the vocabulary dimension: source, target and softmax.
    vocab_vars = [v for v in model.trainable_variables if 50 in v.shape]
    assert len(vocab_vars) == 1 and vocab_vars[0] is model.source_embedding.embeddings
    # The softmax really reads it: zeroing row 7 makes token 7's logit exactly 0 everywhere.
    vocab_vars[0].assign(tf.tensor_scatter_nd_update(vocab_vars[0], [[7]],
                                                     tf.zeros([1, TINY["d_model"]])))
    logits = model((tf.constant([[5, 6, 8]]), tf.constant([[2, 9]])))
    np.testing.assert_array_equal(logits[..., 7], 0.0)


def test_separate_vocabularies_keep_separate_embeddings():
    model = Transformer(source_vocab_size=40, target_vocab_size=30, share_embeddings=False,
                        **TINY)
    logits = model((tf.constant([[39, 5]]), tf.constant([[29, 4, 5]])))
    assert logits.shape == (1, 3, 30)
    assert model.source_embedding is not model.target_embedding
    with pytest.raises(ValueError, match="one vocabulary"):
        Transformer(source_vocab_size=40, target_vocab_size=30, **TINY)


def test_untied_output_with_shared_embeddings_has_its_own_output_layer():
    model = Transformer(vocab_size=50, tie_output=False, **TINY)
    model.build()
    assert model.source_embedding is model.target_embedding
    assert model.output_projection is not None
    # The logits are the decoder states times that layer's kernel, not the embedding.
    source, target = tf.constant([[5, 6, 8, 3]]), tf.constant([[2, 9, 4]])
    memory, padding = model.encode(source)
    states, _ = model.decoder_states(target, memory, padding)
    logits = model.decode(target, memory, padding)
    np.testing.assert_allclose(logits, states @ model.output_projection.kernel, atol=1e-5)
    assert np.abs(logits - tf.einsum("btd,vd->btv", states,
                                     model.source_embedding.embeddings)).max() > 1e-2


def test_model_saves_and_loads_as_keras_file(tmp_path):
    model = Transformer(vocab_size=30, norm_first=True, position="learned", **TINY)
    inputs = (tf.constant([[4, 5, 6]]), tf.constant([[2, 7]]))
    expected = model(inputs)
    model.save(tmp_path / "model.keras")
    restored = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(restored, Transformer)
    assert restored.get_config() == model.get_config()
    np.testing.assert_allclose(restored(inputs), expected, atol=1e-6)


def transformer_parameters(vocab, num_layers, d_model, d_ff, norm_first=False, **_):
    """The paper's architecture counted by hand: shared embeddings, biased projections, two
    LayerNorm vectors per norm; pre-norm adds one final norm per stack."""
    attention = 4 * (d_model * d_model + d_model)
    ffn = 2 * d_model * d_ff + d_ff + d_model
    norm = 2 * d_model
    encoder = num_layers * (attention + ffn + 2 * norm)
    decoder = num_layers * (2 * attention + ffn + 3 * norm)
    return vocab * d_model + encoder + decoder + (2 * norm if norm_first else 0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_built_model_has_the_hand_counted_parameters(norm_first):
    assert count_parameters("tiny", vocab_size=300, norm_first=norm_first) == \
        transformer_parameters(300, norm_first=norm_first, **TINY)


@pytest.mark.parametrize("name", ["base", "big"])
def test_paper_parameter_counts(name):
    # Counted, not built: a 63M/214M-parameter model would take seconds to build for a sum.
    count = transformer_parameters(37000, **get_preset(name))
    assert abs(count - PAPER_PARAMETERS[name]) / PAPER_PARAMETERS[name] < 0.05, count


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("huge")


def test_sizes_no_transformer_can_have_are_refused_before_building():
    from tfnmt.model.presets import PRESETS, check_sizes

    for name in PRESETS:
        check_sizes(get_preset(name))
    with pytest.raises(ValueError, match="d_model=66 must be a multiple of num_heads=4"):
        check_sizes(get_preset("tiny", d_model=66))
    with pytest.raises(ValueError, match="d_model=63 must be even"):
        check_sizes(get_preset("tiny", d_model=63, num_heads=3))
    # The layers themselves refuse the same sizes.
    for sizes in (dict(d_model=66), dict(d_model=63, num_heads=3)):
        with pytest.raises(ValueError):
            Transformer(vocab_size=30, **dict(TINY, **sizes))


def test_cached_greedy_equals_uncached_greedy():
    from tfnmt.inference.decoding import greedy_decode_uncached
    from tfnmt.inference.greedy_search import greedy_decode

    model = Transformer(vocab_size=30, **TINY)
    source = tf.constant(random_ids(np.random.default_rng(5), 3, 6, 30))
    cached, scores = greedy_decode(model, source, max_length=9)
    uncached = greedy_decode_uncached(model, source, max_length=9)
    np.testing.assert_array_equal(cached, uncached)
    compiled, compiled_scores = tf.function(
        lambda s: greedy_decode(model, s, max_length=9))(source)
    np.testing.assert_array_equal(compiled, cached)
    np.testing.assert_allclose(compiled_scores, scores, rtol=1e-5)
    assert np.all(scores.numpy() < 0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_tf_checkpoint_saves_and_restores_every_variable(tmp_path, norm_first):
    model = Transformer(vocab_size=30, norm_first=norm_first, **TINY)
    model.build()
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    saved = [n for n in tf.train.list_variables(path) if n[0].startswith("model/")]
    assert len(saved) == len(model.weights)
    fresh = Transformer(vocab_size=30, norm_first=norm_first, **TINY)
    fresh.build()
    tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("tied", [True, False])
def test_decoder_states_times_output_kernel_are_the_logits(tied):
    """The training loss projects decoder_states with output_kernel itself."""
    if tied:
        model = Transformer(vocab_size=30, **TINY)
    else:
        model = Transformer(source_vocab_size=40, target_vocab_size=30, share_embeddings=False,
                            tie_output=False, **TINY)
    source = tf.constant([[5, 6, 7, 3], [8, 9, 3, 0]])
    target = tf.constant([[2, 4, 5], [2, 6, 0]])
    memory, padding = model.encode(source)
    states, _ = model.decoder_states(target, memory, padding)
    kernel = model.output_kernel()
    assert kernel.shape == (30, model.d_model)
    np.testing.assert_allclose(tf.einsum("btd,vd->btv", states, kernel),
                               model.decode(target, memory, padding), rtol=1e-5, atol=1e-5)


def test_model_defaults_are_the_transformer_signatures():
    # Read without TensorFlow (train.py resolves a saved model's settings before it loads):
    # each of the Transformer's keyword arguments with the default it builds with.
    import inspect

    from tfnmt.model.presets import MODEL_DEFAULTS

    signature = inspect.signature(Transformer.__init__).parameters.values()
    assert MODEL_DEFAULTS == {p.name: p.default for p in signature
                              if p.default is not inspect.Parameter.empty}
