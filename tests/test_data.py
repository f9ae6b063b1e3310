import collections

import numpy as np
import pytest
import tensorflow as tf

from tfnmt.data import pipeline, records
from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID


def pairs_of(batches):
    """Multiset of (source, target) id tuples in the batches, padding stripped."""
    found = collections.Counter()
    for batch in batches:
        source, target_in, target_out = (batch[k].numpy() for k in
                                         ("source", "target_in", "target_out"))
        for s, ti, to in zip(source, target_in, target_out):
            s, ti, to = s[s != PAD_ID], ti[ti != PAD_ID], to[to != PAD_ID]
            assert s[-1] == EOS_ID and ti[0] == BOS_ID and to[-1] == EOS_ID
            np.testing.assert_array_equal(ti[1:], to[:-1])
            found[(tuple(s[:-1]), tuple(to[:-1]))] += 1
    return found


def all_pairs(data_dir, split, max_length):
    manifest = records.load_manifest(data_dir)
    expected = collections.Counter()
    for raw in tf.data.TFRecordDataset(records.shard_paths(data_dir, manifest, split)):
        example = tf.train.Example.FromString(raw.numpy())
        s = tuple(example.features.feature["source"].int64_list.value)
        t = tuple(example.features.feature["target"].int64_list.value)
        if max(len(s), len(t)) + 1 <= max_length:
            expected[(s, t)] += 1
    return expected


def test_every_batch_respects_the_token_budget(small_prepared):
    batches = list(pipeline.make_dataset(small_prepared, "train", batch_tokens=512, max_length=64,
                                         seed=0))
    for batch in batches:
        size = batch["source"].shape[0]
        longest = max(batch["source"].shape[1], batch["target_in"].shape[1])
        assert size * longest <= 512
        assert longest <= 64
    assert len(batches) > 20


def test_an_epoch_yields_every_kept_pair_exactly_once(small_prepared):
    expected = all_pairs(small_prepared, "train", max_length=48)
    manifest = records.load_manifest(small_prepared)
    dropped = pipeline.dropped_by_length(manifest, "train", 48)
    assert dropped > 0 and sum(expected.values()) == 3000 - dropped
    dataset = pipeline.make_dataset(small_prepared, "train", batch_tokens=1024, max_length=48,
                                    seed=3)
    assert pairs_of(dataset) == expected


def test_a_split_with_no_pair_short_enough_is_refused_not_waited_on(small_prepared):
    # A repeated (training) dataset whose every pair is longer than max_length would look for
    # a first batch forever: refused with the shortest length, counted from the records.
    shortest = min(max(len(s), len(t)) + 1 for s, t in all_pairs(small_prepared, "train", 10**6))
    with pytest.raises(pipeline.BatchingError,
                       match=f"no pair of the train split fits max_length={shortest - 1}: its "
                             f"shortest is {shortest} subwords long"):
        pipeline.make_dataset(small_prepared, "train", 1024, max_length=shortest - 1,
                              repeat=True)
    # A batch of one pair: a larger budget would wait for as many repeats of the split as it
    # holds pairs of the shortest length.
    batch = next(iter(pipeline.make_dataset(small_prepared, "train", shortest,
                                            max_length=shortest, repeat=True, seed=0)))
    assert max(batch["source"].shape[1], batch["target_in"].shape[1]) == shortest
    # Read once (an evaluation), the same split is a defined result: no batch.
    assert not list(pipeline.make_dataset(small_prepared, "train", 1024,
                                          max_length=shortest - 1))


def test_reading_is_deterministic_with_a_seed(small_prepared):
    def first_batches(seed):
        dataset = pipeline.make_dataset(small_prepared, "train", batch_tokens=512, max_length=64,
                                        seed=seed)
        return [b["source"].numpy().tolist() for b in dataset.take(5)]

    assert first_batches(7) == first_batches(7)
    assert first_batches(7) != first_batches(8)


@pytest.mark.parametrize("pipelines", [2, 8])  # 2 <= 4 shard files: by file; 8 > 4: by record
def test_input_pipelines_split_the_data_between_them(small_prepared, pipelines):
    parts = []
    for index in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                             input_pipeline_id=index,
                                             num_replicas_in_sync=pipelines)
        parts.append(pairs_of(pipeline.make_dataset(small_prepared, "train", batch_tokens=1024,
                                                    max_length=64, seed=0, input_context=context)))
    union = sum(parts, collections.Counter())
    assert union == all_pairs(small_prepared, "train", 64)
    assert all(sum(p.values()) > 0 for p in parts)


def test_bucket_sizes_follow_the_budget():
    # Each edge the one before x 1.1, rounded down, at least one more; the last max_length + 1.
    assert pipeline.bucket_boundaries(40) == [*range(8, 21), 22, 24, 26, 28, 30, 33, 36, 39, 41]
    boundaries = pipeline.bucket_boundaries(100)
    assert boundaries[0] == 8 and boundaries[-1] == 101
    assert all(b > a for a, b in zip(boundaries, boundaries[1:]))
    sizes = pipeline.bucket_batch_sizes(boundaries, 1000)
    assert sizes[0] == 1000 // 7 and sizes[-2] == 1000 // 100
    with pytest.raises(ValueError, match="cannot hold one pair"):
        pipeline.bucket_batch_sizes(boundaries, 50)


def test_one_bucket_per_length_fills_the_budget(small_prepared):
    """bucket_growth=1.0: from 8 tokens on, a batch's pairs all have the same longer
    side L, and it holds batch_tokens // L of them (the epoch's last batch of a length may
    hold fewer)."""
    assert pipeline.bucket_boundaries(20, growth=1.0) == list(range(8, 22))
    with pytest.raises(ValueError, match="growth"):
        pipeline.bucket_boundaries(20, growth=0.9)
    full = 0
    for batch in pipeline.make_dataset(small_prepared, "train", batch_tokens=512, max_length=64,
                                       seed=0, bucket_growth=1.0):
        longer = np.maximum(np.sum(batch["source"].numpy() != 0, 1),
                            np.sum(batch["target_out"].numpy() != 0, 1))
        if longer.max() >= 8:
            assert longer.min() == longer.max()
            assert len(longer) <= 512 // longer[0]
            full += len(longer) == 512 // longer[0]
    assert full > 0


def test_length_buckets_cut_padding(small_prepared):
    # padding_fraction against a count over the batches' ids; narrower buckets, less padding
    # (the embedded corpus' figures are bench/pipeline.py's).
    def fraction(growth):
        batches = list(pipeline.make_dataset(small_prepared, "train", batch_tokens=512,
                                             max_length=64, seed=0, bucket_growth=growth))
        ids = [batch[key].numpy() for batch in batches for key in ("source", "target_in")]
        counted = 1.0 - sum((x != PAD_ID).sum() for x in ids) / sum(x.size for x in ids)
        reported, count = pipeline.padding_fraction(batches)
        assert count == len(batches) and reported == pytest.approx(counted, abs=1e-12)
        return reported

    one_per_length, ten_percent, one_bucket = fraction(1.0), fraction(1.1), fraction(100.0)
    assert one_per_length < ten_percent < one_bucket / 2, (one_per_length, ten_percent,
                                                           one_bucket)


@pytest.mark.parametrize("growth", [1.0, 1.1])
def test_shape_stable_batches_have_one_shape_per_bucket(small_prepared, growth):
    boundaries = pipeline.bucket_boundaries(64, growth=growth)
    dataset = pipeline.make_dataset(small_prepared, "train", batch_tokens=512, max_length=64,
                                    seed=0, shape_stable=True, bucket_growth=growth)
    plain = pipeline.make_dataset(small_prepared, "train", batch_tokens=512, max_length=64,
                                  seed=0, bucket_growth=growth)
    shapes = collections.defaultdict(set)
    for batch in dataset:
        length = batch["source"].shape[1]
        # Both sides padded to a bucket's last length (edge - 1), whatever the pairs inside.
        assert batch["target_in"].shape[1] == length == batch["target_out"].shape[1]
        assert length + 1 in boundaries or length < boundaries[0]
        shapes[length].add(batch["source"].shape[0])
    # One batch size per bucket, except the epoch's last (partial) batch of each bucket.
    assert all(len(sizes) <= 2 for sizes in shapes.values())
    # The same pairs as without shape stability (only the padding differs).
    assert pairs_of(dataset) == pairs_of(plain)
