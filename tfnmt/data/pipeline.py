"""The tf.data pipeline: TFRecord shards -> length-bucketed, token-budgeted, padded batches.

As in the paper (§5.1), pairs of similar length are batched together and a batch holds about
`batch_tokens` tokens: batch size x padded length of the longer side <= batch_tokens, with the
padded length counting EOS (source) or BOS/EOS (target). Under tf.distribute the budget is per
replica, and each input pipeline reads its own shard files (or every n-th record when there are
fewer files than pipelines).
"""
import logging
import os

import tensorflow as tf

from tfnmt.data import records
from tfnmt.data.corpus import CorpusError
from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID
from tfnmt.data.vocabulary import model_type, subword_sampling_error


class BatchingError(ValueError):
    """The batching settings (batch_tokens, max_length) cannot batch the data."""


def bucket_boundaries(max_length, min_length=8, growth=1.1):
    """Bucket edges for `make_dataset`: min_length, then each × growth (at least +1), ending at
    max_length + 1 (exclusive). 1.1 (default): buckets 10% wide. 1.0: one bucket per length from
    min_length on, so a batch fills its token budget to within one pair (as OpenNMT-tf's
    length_bucket_width=1): faster steps but, in the main job, a worse dev loss (CHANGELOG.md,
    "Measured gains of the speed-ups").

    Args:
      max_length: the longest pair kept.
      min_length: the first edge.
      growth: the ratio between consecutive edges, >= 1.0.

    Returns:
      The increasing list of edges.

    Raises:
      ValueError: growth below 1.
    """
    if growth < 1.0:
        raise ValueError(f"bucket growth must be >= 1.0, got {growth}")
    boundaries = []
    length = min_length
    while length <= max_length:
        boundaries.append(length)
        length = max(length + 1, int(length * growth))
    return boundaries + [max_length + 1]


def bucket_batch_sizes(boundaries, batch_tokens):
    """Pairs per batch of each bucket, so that a batch of the bucket's longest pairs holds at most
    `batch_tokens` tokens per side.

    Args:
      boundaries: bucket edges (bucket i holds lengths < boundaries[i]).
      batch_tokens: the token budget.

    Returns:
      One size per bucket, plus one for bucket_by_sequence_length's last bucket (lengths >= the
      last edge), empty after the max_length filter but in need of a size.

    Raises:
      BatchingError: the budget cannot hold one pair of the longest length.
    """
    longest = boundaries[-1] - 1
    if batch_tokens < longest:
        raise BatchingError(f"batch_tokens={batch_tokens} cannot hold one pair of the "
                            f"maximum length {longest}; raise batch_tokens or lower max_length")
    sizes = [max(1, batch_tokens // (edge - 1)) for edge in boundaries]
    return sizes + [sizes[-1]]


_FEATURES = {"source": tf.io.RaggedFeature(tf.int64), "target": tf.io.RaggedFeature(tf.int64)}


@tf.autograph.experimental.do_not_convert  # plain ops: no conversion cost per pipeline
def _parse(serialized):
    example = tf.io.parse_single_example(serialized, _FEATURES)
    return tf.cast(example["source"], tf.int32), tf.cast(example["target"], tf.int32)


@tf.autograph.experimental.do_not_convert
def _to_model_inputs(source, target):
    eos, bos = tf.constant([EOS_ID]), tf.constant([BOS_ID])
    return {"source": tf.concat([source, eos], 0),        # [S]   ... EOS
            "target_in": tf.concat([bos, target], 0),     # [T]   BOS ...
            "target_out": tf.concat([target, eos], 0)}    # [T]   ... EOS


@tf.autograph.experimental.do_not_convert
def _record_to_model_inputs(serialized):
    return _to_model_inputs(*_parse(serialized))


@tf.autograph.experimental.do_not_convert
def _length(example):
    return tf.maximum(tf.shape(example["source"])[0], tf.shape(example["target_in"])[0])


def dropped_by_length(manifest, split, max_length):
    """How many pairs of a split `make_dataset` drops as too long (from the manifest's histogram).

    Args:
      manifest: a prepared directory's manifest.
      split: "train", "dev" or "test".
      max_length: the longest pair kept.

    Returns:
      The count.
    """
    histogram = manifest["splits"][split]["length_histogram"]
    return sum(count for length, count in histogram.items() if int(length) > max_length)


def _records(files, shuffle, seed, shuffle_buffer, repeat, input_context):
    """Serialized pairs of TFRecord files: this input pipeline's share (whole files when there
    are enough, else every n-th record), shuffled, repeated."""
    dataset = tf.data.Dataset.from_tensor_slices(files)
    shard_records = False
    if input_context and input_context.num_input_pipelines > 1:
        if len(files) >= input_context.num_input_pipelines:
            dataset = dataset.shard(input_context.num_input_pipelines,
                                    input_context.input_pipeline_id)
        else:
            shard_records = True
    if shuffle:
        dataset = dataset.shuffle(len(files), seed=seed)
    dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                                 num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shard_records:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    return dataset.repeat() if repeat else dataset


def corpus_weights(manifest, weights=None):
    """The sampling probabilities of the train split's corpora.

    Args:
      manifest: a prepared directory's manifest.
      weights: one positive weight per corpus, or None (each in proportion to its pairs, as
        if they were one corpus).

    Returns:
      A list of probabilities summing to 1 (one per corpus; [1.0] for one corpus). A corpus
      the filters left empty gets 0 when no weights are given.

    Raises:
      ValueError: as many weights as corpora are needed, all positive.
      CorpusError: a weight is given to a corpus the filters left empty (it could not be
        sampled: the others would share its part).
    """
    corpora = manifest["splits"]["train"].get("corpora") or [
        {"examples": manifest["splits"]["train"]["examples"]}]
    if weights is None:
        weights = [c["examples"] for c in corpora] if any(c["examples"] for c in corpora) \
            else [1] * len(corpora)
    elif len(weights) != len(corpora) or min(weights) <= 0:
        raise ValueError(f"{len(corpora)} training corpora need {len(corpora)} positive "
                         f"weights, got {list(weights)}")
    elif len(corpora) > 1:
        for corpus, weight in zip(corpora, weights):
            if not corpus["examples"]:
                raise CorpusError(f"--train_files={corpus['files']}: no training pair of it is "
                                  f"left after the filters, so it cannot be sampled at weight "
                                  f"{weight:g}: drop it and its --train_weights entry")
    return [w / sum(weights) for w in weights]


class SubwordSampler:
    """Subword regularization (Kudo, 2018): each time a pair is read, both sides are segmented
    anew, a segmentation sampled from the SentencePiece model's instead of its best one (a
    unigram model samples among its `nbest` best segmentations, their probabilities raised to
    `alpha`; a BPE model drops each merge with probability `alpha`, as BPE-dropout). The model
    then sees words split in several ways, which regularizes a long run on a small corpus.
    The records keep the best segmentation: a batch of pairs is joined back into its
    (normalized) text and segmented again. The samples do not follow the pipeline's seed.

    Args:
      vocabulary: the `Vocabulary` the records were tokenized with.
      alpha: the unigram model's smoothing (> 0; smaller samples more widely) or the BPE
        model's merge-dropout probability (0 < alpha < 1).
      nbest: the unigram model samples among this many best segmentations (-1: all of them).

    Example:
      sampler = SubwordSampler(vocabulary, alpha=0.1, nbest=64)
      dataset = make_dataset(data_dir, "train", subword_sampler=sampler, ...)
    """

    def __init__(self, vocabulary, alpha, nbest=64):
        import tensorflow_text as tf_text

        if alpha <= 0:
            raise ValueError(f"subword sampling needs alpha > 0, got {alpha}")
        if nbest == 0 or nbest < -1:
            raise ValueError(f"nbest must be positive or -1 (all), got {nbest}")
        sides = {"source": vocabulary.source, "target": vocabulary.target}
        for side, tokenizer in sides.items():
            error = subword_sampling_error(model_type(tokenizer.model_proto), alpha)
            if error:
                whose = "the vocabulary's" if vocabulary.shared else f"the {side} side's"
                raise ValueError(f"{whose} SentencePiece model: {error}")
        self.alpha, self.nbest = float(alpha), int(nbest)
        self.vocabulary = vocabulary

        def sampler(tokenizer):
            return tf_text.SentencepieceTokenizer(model=tokenizer.model_proto, out_type=tf.int32,
                                                  nbest_size=self.nbest, alpha=self.alpha)
        self._source = sampler(vocabulary.source)
        self._target = self._source if vocabulary.target is vocabulary.source \
            else sampler(vocabulary.target)

    @tf.autograph.experimental.do_not_convert
    def __call__(self, source, target):
        """Segments a batch of pairs anew: ragged ids [B, None] each -> ragged ids [B, None]."""
        return (self._source.tokenize(self.vocabulary.source.detokenize(source)),
                self._target.tokenize(self.vocabulary.target.detokenize(target)))


def check_pairs_fit(manifest, split, max_length):
    """Raises BatchingError when no pair of a split, or of one of its training corpora, is
    `max_length` long or shorter: a repeated dataset of them would search for a first batch
    forever. Lengths are the manifest's (subword sampling may vary them a little).

    Args:
      manifest: a prepared directory's manifest.
      split: "train", "dev" or "test".
      max_length: the longest pair kept.
    """
    entry = manifest["splits"][split]
    parts = [(f"the {split} split", entry)] + [
        (f"the {split} corpus {corpus['files']}", corpus)
        for corpus in entry.get("corpora") or [] if "length_histogram" in corpus]
    for name, part in parts:
        lengths = [int(length) for length, count in part["length_histogram"].items() if count]
        if lengths and min(lengths) > max_length:
            raise BatchingError(f"no pair of {name} fits max_length={max_length}: its shortest "
                                f"is {min(lengths)} subwords long (with EOS or BOS); raise "
                                "max_length")


def model_inputs(data_dir, manifest, split, max_length=256, shuffle=True, seed=None,
                 shuffle_buffer=20000, repeat=False, input_context=None, weights=None,
                 subword_sampler=None):
    """A split's pairs as model inputs, one at a time, before batching: those of at most
    `max_length` subwords, and with several training corpora (repeated and shuffled) drawn
    from them at random by `weights`, among the pairs that length leaves.

    Args: as `make_dataset`'s (`manifest`: the directory's).

    Returns:
      A `tf.data.Dataset` of {"source" [S], "target_in" [T], "target_out" [T]}.
    """
    def usable(records_dataset):
        if subword_sampler is None:  # one map per record
            pairs = records_dataset.map(_record_to_model_inputs,
                                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:  # sampled in batches: one tokenizer call per 256 pairs
            pairs = records_dataset.map(_parse, num_parallel_calls=tf.data.AUTOTUNE,
                                        deterministic=True).ragged_batch(256).map(
                subword_sampler, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True).unbatch().map(
                _to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return pairs.filter(tf.autograph.experimental.do_not_convert(
            lambda example: _length(example) <= max_length))

    corpora = manifest["splits"][split].get("corpora") or []
    if len(corpora) > 1 and repeat and shuffle:  # a mixture, sampled in proportion
        parts = [usable(_records([os.path.join(data_dir, f) for f in c["shards"]], shuffle,
                                 seed, shuffle_buffer, repeat, input_context))
                 for c in corpora]
        return tf.data.Dataset.sample_from_datasets(parts, corpus_weights(manifest, weights),
                                                    seed=seed)
    files = records.shard_paths(data_dir, manifest, split)
    return usable(_records(files, shuffle, seed, shuffle_buffer, repeat, input_context))


def make_dataset(data_dir, split, batch_tokens=4096, max_length=256, shuffle=True, seed=None,
                 repeat=False, shuffle_buffer=20000, input_context=None, vocab_fingerprint=None,
                 boundaries=None, shape_stable=False, bucket_growth=1.1, weights=None,
                 subword_sampler=None):
    """The training or evaluation batches of a prepared split, bucketed by length, each within a
    token budget.

    With `shape_stable`, both sides of a batch are padded to its bucket's upper edge, so a
    bucket always gives the same [B, L] shapes: per-shape work (oneDNN primitives, XLA
    programs) is then done once per bucket rather than once per batch.

    Args:
      data_dir: a directory `records.prepare` wrote.
      split: "train", "dev" or "test".
      batch_tokens: the token budget of a batch (per replica under `input_context`).
      max_length: pairs longer than this (in subwords, either side) are dropped.
      shuffle, seed, shuffle_buffer: shuffling of the pairs (and of the batches).
      repeat: repeat the split forever.
      input_context: a `tf.distribute.InputContext`: this input pipeline's shard.
      vocab_fingerprint: refuse records made with another vocabulary.
      boundaries: bucket edges; default `bucket_boundaries(max_length, growth=bucket_growth)`.
      shape_stable: pad each batch to its bucket's upper edge.
      bucket_growth: the ratio between consecutive bucket edges.
      weights: with several training corpora, repeated and shuffled: how often each is
        sampled (`corpus_weights`); pairs are drawn from them at random in these proportions.
      subword_sampler: a `SubwordSampler` that segments each pair anew as it is read (the
        length filter and buckets see the sampled lengths), or None.

    Returns:
      A `tf.data.Dataset` of {"source" [B, S], "target_in" [B, T], "target_out" [B, T]},
      int32, PAD-padded (target_in starts with BOS, target_out ends with EOS).

    Raises:
      records.PreparedDataError: the directory is incomplete or made with another vocabulary.
      BatchingError: batch_tokens cannot hold a pair of max_length; with `repeat`, no pair of
        the split (or of one of its corpora) fits max_length.
    """
    manifest = records.load_manifest(data_dir, vocab_fingerprint)
    if repeat:
        check_pairs_fit(manifest, split, max_length)
    dropped = dropped_by_length(manifest, split, max_length)
    if dropped:
        logging.info("%s: dropping %d of %d pairs longer than max_length=%d", split, dropped,
                     manifest["splits"][split]["examples"], max_length)

    dataset = model_inputs(data_dir, manifest, split, max_length, shuffle, seed,
                           shuffle_buffer, repeat, input_context, weights, subword_sampler)
    boundaries = boundaries or bucket_boundaries(max_length, growth=bucket_growth)
    dataset = dataset.bucket_by_sequence_length(
        _length, boundaries, bucket_batch_sizes(boundaries, batch_tokens),
        padded_shapes={"source": [None], "target_in": [None], "target_out": [None]},
        padding_values=PAD_ID, pad_to_bucket_boundary=shape_stable, drop_remainder=False)
    options = tf.data.Options()
    options.deterministic = seed is not None or not shuffle
    # Sharding is done above by hand (per file, else per record); stop tf.distribute redoing it.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def padding_fraction(batches):
    """The share of padded positions in batches.

    Args:
      batches: an iterable of `make_dataset` batches.

    Returns:
      (padded positions / all positions over both sides, the number of batches).
    """
    real = padded = count = 0
    for batch in batches:
        for key in ("source", "target_in"):
            ids = batch[key]
            real += int(tf.reduce_sum(tf.cast(tf.not_equal(ids, PAD_ID), tf.int64)))
            padded += int(tf.size(ids))
        count += 1
    return 1.0 - real / max(padded, 1), count
