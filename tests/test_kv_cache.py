"""The in-place self-attention stores (tfnmt/kv_cache.py) against a concatenated, gathered cache."""
import numpy as np
import tensorflow as tf

from tfnmt import kv_cache

HEADS, HEAD_DIM = 2, 3


def test_stores_read_what_a_reordered_concatenated_cache_holds():
    # 3 sentences x 2 beams (6 slots), 40 steps: the stores grow past their first capacity
    # (16 steps, then 32, then max_length 40); beams are reordered each step and sentences
    # leave. Every read must equal the reference cache, which appends each step's keys
    # (a concat) and reorders whole rows (a gather).
    rng = np.random.default_rng(0)
    sentences, beams, max_length = 3, 2, 40
    slots = sentences * beams
    initial = [{"self": {"key": tf.zeros([slots, HEADS, 0, HEAD_DIM])}}]
    heads, stores = kv_cache.empty_stores(initial)
    assert heads == HEADS
    store = stores[0]["key"]
    active = np.arange(sentences)  # sentence indices still searched
    ancestry = tf.zeros([slots, 0], tf.int32)
    reference = tf.zeros([slots, HEADS, 0, HEAD_DIM])
    for step in range(max_length):
        row_slots = tf.constant((active[:, None] * beams + np.arange(beams)).reshape(-1),
                                tf.int32)
        rows = kv_cache.step_rows(step, slots, HEADS, row_slots, ancestry)
        store = kv_cache.grow([{"key": store}], step, slots, HEADS, max_length)[0]["key"]
        new = tf.constant(rng.normal(size=(len(row_slots), HEADS, 1, HEAD_DIM)), tf.float32)
        store, read = kv_cache.write_and_read(store, new, rows["write_rows"], rows["read_rows"])
        reference = tf.concat([reference, new], axis=2)
        np.testing.assert_array_equal(read, reference)
        # Next step: each sentence's beams extend random old beams; sentence 1 leaves at 20.
        staying = [i for i, s in enumerate(active) if not (s == 1 and step == 20)]
        parents = np.array([i * beams + rng.integers(0, beams, beams) for i in staying])
        parents = tf.constant(parents.reshape(-1), tf.int32)
        ancestry = tf.gather(tf.concat([ancestry, row_slots[:, None]], axis=1), parents)
        reference = tf.gather(reference, parents)
        active = active[staying]
    assert store.shape[0] == max_length * slots * HEADS  # 16 -> 32 -> 40 steps, no more


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
