"""tfnmt/model/kv_cache.py: a search's DecoderCache (in-place stores) against a concatenated,
gathered cache."""
import numpy as np
import tensorflow as tf

from tfnmt.model import kv_cache

HEADS, HEAD_DIM = 2, 3


class OneLayerModel:
    """What DecoderCache asks of a model: initial_cache, for one layer."""

    def initial_cache(self, memory):
        return [{"self": kv_cache.AppendCache.empty(tf.shape(memory)[0], HEADS, HEAD_DIM,
                                                    tf.float32),
                 "memory": {"key": memory, "value": -memory}}]


def test_decoder_cache_reads_what_a_reordered_concatenated_cache_holds():
    # 3 sentences x 2 beams (6 slots), 40 steps: the stores grow past their first capacity
    # (16 steps, then 32, then max_length 40); beams are reordered each step and sentences
    # leave. Every read must equal the reference cache, which appends each step's keys
    # (a concat) and reorders whole rows (a gather); the encoder keys/values follow the
    # sentences that stay.
    rng = np.random.default_rng(0)
    sentences, beams, max_length = 3, 2, 40
    slots = sentences * beams
    memory = tf.constant(rng.normal(size=(sentences, HEADS, 5, HEAD_DIM)), tf.float32)
    padding = tf.constant(rng.random((sentences, 5)) > 0.3)
    cache = kv_cache.DecoderCache(OneLayerModel(), memory, padding, slots, max_length,
                                  groups=beams)
    state = cache.state
    active = np.arange(sentences)  # sentence indices still searched
    reference = tf.zeros([slots, HEADS, 0, HEAD_DIM])
    for step in range(max_length):
        row_slots = tf.constant((active[:, None] * beams + np.arange(beams)).reshape(-1),
                                tf.int32)
        layers, state = cache.for_step(state, step, row_slots)
        np.testing.assert_array_equal(layers[0]["memory"]["key"], tf.gather(memory, active))
        assert layers[0]["memory"]["groups"] == beams  # each sentence's rows query it
        np.testing.assert_array_equal(state["source_padding"], tf.gather(padding, active))
        new = tf.constant(rng.normal(size=(len(row_slots), HEADS, 1, HEAD_DIM)), tf.float32)
        keys, values, written = layers[0]["self"].append(new, 2 * new)
        state = cache.update(state, [{"self": written, "memory": layers[0]["memory"]}])
        reference = tf.concat([reference, new], axis=2)
        np.testing.assert_array_equal(keys, reference)
        np.testing.assert_array_equal(values, 2 * reference)
        # Next step: each sentence's beams extend random old beams; sentence 1 leaves at 20.
        staying = [i for i, s in enumerate(active) if not (s == 1 and step == 20)]
        parents = np.array([i * beams + rng.integers(0, beams, beams) for i in staying])
        parents = tf.constant(parents.reshape(-1), tf.int32)
        state = cache.reorder(state, row_slots, parents, tf.constant(staying, tf.int32))
        reference = tf.gather(reference, parents)
        active = active[staying]
    assert state["stores"][0]["key"].shape[0] == max_length * slots * HEADS  # 16, 32, 40 steps


def test_append_cache_concatenates():
    cache = kv_cache.AppendCache.empty(2, HEADS, HEAD_DIM, tf.float32)
    steps = [tf.random.normal([2, HEADS, 1, HEAD_DIM]) for _ in range(3)]
    for new in steps:
        keys, values, cache = cache.append(new, -new)
    np.testing.assert_array_equal(keys, tf.concat(steps, axis=2))
    np.testing.assert_array_equal(values, -tf.concat(steps, axis=2))


def test_grow_keeps_what_was_written():
    store = tf.zeros([0, HEAD_DIM])
    store = kv_cache.grow([{"key": store}], 0, 1, 1, 100)[0]["key"]
    assert store.shape[0] == kv_cache.INITIAL_CAPACITY
    values = tf.reshape(tf.range(kv_cache.INITIAL_CAPACITY * HEAD_DIM, dtype=tf.float32),
                        [-1, HEAD_DIM])
    store = tf.raw_ops.InplaceUpdate(x=store, i=tf.range(kv_cache.INITIAL_CAPACITY), v=values)
    grown = kv_cache.grow([{"key": store}], kv_cache.INITIAL_CAPACITY, 1, 1, 100)[0]["key"]
    assert grown.shape[0] == 2 * kv_cache.INITIAL_CAPACITY
    np.testing.assert_array_equal(grown[:kv_cache.INITIAL_CAPACITY], values)
    same = kv_cache.grow([{"key": store}], kv_cache.INITIAL_CAPACITY - 1, 1, 1, 100)[0]["key"]
    assert same.shape[0] == kv_cache.INITIAL_CAPACITY
