"""Several training corpora sampled by weight, and the training-pair filters."""
import collections
import os
import re

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from helpers import python, train_flags
from tfnmt.data import pipeline, records
from tfnmt.data.corpus import CorpusError
from tfnmt.data.filters import PairFilter


def write_tsv(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return str(path)


def test_pair_filter_drops_and_counts():
    pair_filter = PairFilter(max_length_ratio=2.0, duplicates=True, identical=True)
    text = [("a b", "x y"), ("a b", "x y"), ("same", "same"), ("c", "z"), ("Mai", "mai")]
    kept = [p for p in text if pair_filter.keep_text(*p)]
    assert kept == [("a b", "x y"), ("c", "z"), ("Mai", "mai")]  # identical: the same text
    # Sides may hold a tab (two-file corpora): pairs that differ only in where it falls are
    # not duplicates.
    assert pair_filter.keep_text("a\tb", "c") and pair_filter.keep_text("a", "b\tc")
    assert not pair_filter.keep_text("a", "b\tc")
    assert pair_filter.keep_ids([1, 2], [3, 4, 5, 6]) and not pair_filter.keep_ids([1], [3, 4, 5])
    assert not pair_filter.keep_ids([], [3, 4, 5])  # an empty side counts as one subword
    assert not pair_filter.keep_ids([1, 2, 3, 4, 5], [6, 7])  # the source the longer side
    assert pair_filter.keep_ids([1, 2], [3]) and pair_filter.keep_ids([1], [2, 3])  # at 2.0
    assert pair_filter.dropped == {"length_ratio": 3, "duplicates": 2, "identical": 1}
    assert PairFilter().settings == {} and PairFilter(identical=True).settings == {
        "identical": True}
    with pytest.raises(ValueError, match=">= 1"):
        PairFilter(max_length_ratio=0.5)


FILTERS = {"max_length_ratio": 4.0, "duplicates": True, "identical": True}


@pytest.fixture(scope="module")
def two_corpora(small_corpus, tmp_path_factory):
    """The small corpus (with duplicates, copies and a misaligned pair added) and a corpus of
    one template, prepared with every filter on; -> (data_dir, manifest, the raw corpora)."""
    root = tmp_path_factory.mktemp("mixture")
    general = [tuple(line.rstrip("\n").split("\t")[:2])
               for line in open(small_corpus["train"], encoding="utf-8")]
    general += general[:40] + [("Berlin", "Berlin")] * 3 + [
        ("Ja.", "Yes, and he went into the city and spoke to all who were there for many days.")]
    template = [(f"Zimmer {n} ist frei.", f"Room {n} is free.") for n in range(600)]
    files = {"train": [write_tsv(root / "general.tsv", general),
                       write_tsv(root / "template.tsv", template)],
             "dev": small_corpus["dev"]}
    data_dir = str(root / "data")
    manifest = records.prepare(data_dir, dataset="files", files=files, vocab_size=600,
                               train_shards=2, filters=FILTERS)
    return data_dir, manifest, (general, template), files


def test_corpora_are_prepared_apart_and_filtered_across(two_corpora):
    data_dir, manifest, (general, template), files = two_corpora
    train = manifest["splits"]["train"]
    # Brute force over the raw text: copies, then repeats, then the subword length ratio.
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(data_dir, "spm.model"))
    seen, expected = set(), {"identical": 0, "duplicates": 0, "length_ratio": 0}
    kept = []
    for pairs in (general, template):
        count = 0
        for source, target in pairs:
            source, target = source.strip(), target.strip()
            if source == target:
                expected["identical"] += 1
            elif (source, target) in seen:
                expected["duplicates"] += 1
            else:
                seen.add((source, target))
                lengths = sorted(max(len(processor.encode(side)), 1) for side in (source, target))
                if lengths[1] > 4.0 * lengths[0]:
                    expected["length_ratio"] += 1
                else:
                    count += 1
        kept.append(count)
    assert expected["identical"] == 3 and expected["duplicates"] >= 40
    assert expected["length_ratio"] >= 1
    assert train["filtered"] == expected
    assert [c["examples"] for c in train["corpora"]] == kept
    # Each corpus has its own length histogram (the longer side, with EOS or BOS), counted here
    # from its records; a max_length that none of one corpus's pairs fits is refused by name.
    shortest = []
    for corpus in train["corpora"]:
        lengths = collections.Counter()
        for raw in tf.data.TFRecordDataset([os.path.join(data_dir, f) for f in corpus["shards"]]):
            features = tf.train.Example.FromString(raw.numpy()).features.feature
            lengths[max(len(features[side].int64_list.value)
                        for side in ("source", "target")) + 1] += 1
        assert {int(k): v for k, v in corpus["length_histogram"].items()} == lengths
        shortest.append(min(lengths))
    assert shortest[1] < shortest[0]  # the template's pairs are the short ones
    pipeline.check_pairs_fit(manifest, "train", shortest[0])
    with pytest.raises(pipeline.BatchingError, match=(
            f"no pair of the train corpus {re.escape(files['train'][0])} fits "
            f"max_length={shortest[0] - 1}: its shortest is {shortest[0]} subwords")):
        pipeline.check_pairs_fit(manifest, "train", shortest[0] - 1)
    assert train["examples"] == sum(kept)
    # The split's histogram (what batching and the budget plan from) sums the corpora's.
    assert {int(k): v for k, v in train["length_histogram"].items()} == sum(
        (collections.Counter({int(k): v for k, v in c["length_histogram"].items()})
         for c in train["corpora"]), collections.Counter())
    assert manifest["settings"]["filters"] == FILTERS
    # The same inputs and filters: up to date, nothing rewritten.
    assert records.prepare(data_dir, dataset="files", files=files, vocab_size=600,
                           train_shards=2, filters=FILTERS) == manifest


@pytest.mark.parametrize("weights, share", [([1, 4], 0.2), (None, None)])
def test_training_pairs_sample_the_corpora_in_proportion(two_corpora, weights, share):
    # Counted on the pairs as they are drawn, before batching: the length buckets hold pairs
    # back for a while (thousands of them), which shifts any short window of batches but not
    # the proportions a run trains on.
    data_dir, manifest, _, _ = two_corpora
    corpora = manifest["splits"]["train"]["corpora"]
    if share is None:  # no weights: in proportion to their sizes, as one corpus would be
        share = corpora[0]["examples"] / sum(c["examples"] for c in corpora)
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(data_dir, "spm.model"))
    prefix = processor.encode("Zimmer")  # how every source of the template corpus starts
    pairs = pipeline.model_inputs(data_dir, manifest, "train", max_length=64, shuffle=True,
                                  seed=3, repeat=True, weights=weights)
    draws = 12000

    def from_template(pair):  # the source starts with `prefix` (padded: a shorter one does not)
        start = tf.pad(pair["source"], [[0, len(prefix)]])[:len(prefix)]
        return tf.reduce_all(tf.equal(start, prefix))

    template = int(tf.reduce_sum(tf.cast(next(iter(
        pairs.take(draws).map(from_template).batch(draws))), tf.int32)))
    # Binomial standard deviation at n = 12,000: at most 0.0046.
    assert (draws - template) / draws == pytest.approx(share, abs=0.02)
    # The batches hold both.
    batches = pipeline.make_dataset(data_dir, "train", batch_tokens=2048, max_length=64,
                                    shuffle=True, seed=3, repeat=True, weights=weights)
    starts = np.concatenate([np.all(b["source"][:, :len(prefix)].numpy() == prefix, axis=1)
                             for b in batches.take(60)])
    assert 0 < starts.sum() < len(starts)
    with pytest.raises(ValueError, match="2 training corpora need 2 positive weights"):
        pipeline.corpus_weights(manifest, [1, 2, 3])


def test_train_py_with_two_weighted_corpora(two_corpora, small_corpus, tmp_path):
    specs = two_corpora[3]["train"]
    flags = train_flags(small_corpus, None, str(tmp_path / "run"), train_files=specs[0],
                        train_steps=2, eval_every=0, average_last=0, test_report="false",
                        log_every=1, checkpoint_every=2, bleu_sentences=2)
    result = python(*flags, f"--train_files={specs[1]}", "--train_weights=3,1",
                    "--filter_identical", "--filter_duplicates")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sampled 75%" in result.stdout and "sampled 25%" in result.stdout
    assert "filtered out: " in result.stdout and "3 identical" in result.stdout
    refused = python(*flags, "--train_weights=3,1")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "train.py: --train_weights=3,1: 2 weight(s) for 1 --train_files: one per corpus, in "
        "their order")
    for weights in ("3,-1", "3,0", "nan,1", "inf,1"):
        refused = python(*flags, f"--train_files={specs[1]}", f"--train_weights={weights}")
        assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
            f"train.py: --train_weights={weights}: each weight must be a positive number")


def test_a_corpus_the_filters_emptied_is_not_sampled_and_cannot_be_weighted():
    # All of b's pairs were duplicates of a.tsv's: sample_from_datasets would skip the
    # empty corpus and give its share to the others, whatever the weights said.
    manifest = {"splits": {"train": {"examples": 5, "corpora": [
        {"files": "a.tsv", "examples": 5}, {"files": "b.de,b.en", "examples": 0}]}}}
    assert pipeline.corpus_weights(manifest) == [1.0, 0.0]
    with pytest.raises(CorpusError, match=r"^--train_files=b.de,b.en: no training pair of it is "
                       r"left after the filters, so it cannot be sampled at weight 1: drop it "
                       r"and its --train_weights entry$"):
        pipeline.corpus_weights(manifest, [3, 1])


@pytest.mark.parametrize("reverse", [False, True])
def test_dev_and_test_pairs_the_training_corpora_hold_are_counted(two_corpora, tmp_path,
                                                                  reverse):
    # A dev split of 30 training pairs of the first corpus (one with spaces around it), 10 of
    # the second, a repeat and 21 new pairs; a test split of new pairs only. Counted against a
    # brute-force scan of the raw corpora, and read the same either way round.
    from tfnmt.training.experiment import _held_out_warnings

    data_dir, _, (general, template), files = two_corpora
    new = [(f"Neu {n}.", f"New {n}.") for n in range(21)]
    dev = general[100:130] + template[:10] + [general[100]] + new
    dev[0] = (f"  {dev[0][0]} ", dev[0][1])
    test = [(f"Anders {n}.", f"Other {n}.") for n in range(40)]
    files = dict(files, dev=write_tsv(tmp_path / "dev.tsv", dev),
                 test=write_tsv(tmp_path / "test.tsv", test))
    spm = os.path.join(data_dir, "spm.model")
    manifest = records.prepare(str(tmp_path / "data"), dataset="files", files=files,
                               vocab_paths=(spm, spm), train_shards=1, reverse=reverse)
    training = {(s.strip(), t.strip()) for s, t in general + template}
    in_train = sum(any((s.strip(), t.strip()) == pair for pair in training) for s, t in dev)
    assert in_train == 41
    assert manifest["splits"]["train"]["held_out"] == {
        "dev": {"pairs": len(dev), "in_train": in_train}, "test": {"pairs": 40, "in_train": 0}}
    assert _held_out_warnings(manifest) == [
        f"warning: 41 of the {len(dev)} dev pairs are training pairs too (the same source and "
        "target): dev scores (the best checkpoint, the length penalty) reward remembering them; "
        "keep them out of the training data"]


def test_a_few_held_out_pairs_in_the_training_data_are_not_warned_about():
    # Below 5% of a split: short common sentences many corpora share.
    from tfnmt.training.experiment import _held_out_warnings

    def manifest(dev_in_train, test_in_train):
        return {"splits": {"train": {"held_out": {
            "dev": {"pairs": 200, "in_train": dev_in_train},
            "test": {"pairs": 1000, "in_train": test_in_train}}}}}

    assert _held_out_warnings(manifest(9, 49)) == []
    assert [line.split(":")[1] for line in _held_out_warnings(manifest(10, 50))] == [
        " 10 of the 200 dev pairs are training pairs too (the same source and target)",
        " 50 of the 1,000 test pairs are training pairs too (the same source and target)"]
    assert _held_out_warnings({"splits": {"train": {}}}) == []  # prepared without the counts
