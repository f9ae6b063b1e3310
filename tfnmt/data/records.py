"""Tokenized splits as sharded TFRecord files of tf.train.Example, with a manifest.

A prepared directory holds the vocabulary (`spm.model`, or `source.spm.model` and
`target.spm.model`: vocabulary.py), `<split>-SSSSS-of-NNNNN.tfrecord` shards and
`manifest.json`, written last, which records each shard's size and sha256 and the vocabulary's
fingerprint. Every file is written under a temporary name and renamed when complete, and the
old manifest is removed before anything is rewritten, so an interrupted run leaves no manifest
and is never read as complete; once the new manifest is written, shards it does not name
(another shard count, a split no longer given) are removed. Re-running with the same inputs and
settings checks the shards against their checksums and rewrites only the splits that hold a
damaged one, with the same vocabulary; a damaged manifest rebuilds the directory. Readers check
the manifest against the vocabulary they tokenize with and each shard's size, so a changed
vocabulary or a truncated shard is an error, not mixed data. Several runs may share a directory:
while one reads it, another that would change it is refused (data_dir_lock.py).
"""
import collections
import contextlib
import json
import logging
import os
import re

import tensorflow as tf

from tfnmt.data import corpus, data_dir_lock, vocabulary
from tfnmt.data.corpus import input_fingerprint, sha256_file
from tfnmt.data.filters import HeldOutOverlap, PairFilter
from tfnmt.data.tokenizer import normalization_for, train_sentencepiece
from tfnmt.data.vocabulary import Vocabulary
from tfnmt.paths import cannot_write_in, write_atomically

MANIFEST = "manifest.json"
# What `shard_file` names, and its `.tmp` while written: the files this module may remove.
SHARD_NAME = re.compile(r"(train(\.\d+)?|dev|test)-\d{5,}-of-\d{5,}\.tfrecord(\.tmp)?")
FORMAT_VERSION = 2  # 2: a sha256 per shard; the vocabulary by its fingerprint


class PreparedDataError(RuntimeError):
    """A prepared-data directory that is missing, incomplete or inconsistent."""


def _serialize(source_ids, target_ids):
    feature = {
        "source": tf.train.Feature(int64_list=tf.train.Int64List(value=source_ids)),
        "target": tf.train.Feature(int64_list=tf.train.Int64List(value=target_ids)),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _tokenized_pairs(vocab, pairs, batch_size=2048):
    """Streams (source ids, target ids), tokenizing `batch_size` pairs per tf-text call."""
    def tokenize(batch):
        sources = vocab.source.tokenize([s for s, _ in batch]).to_list()
        targets = vocab.target.tokenize([t for _, t in batch]).to_list()
        return zip(sources, targets)

    batch = []
    for pair in pairs:
        batch.append(pair)
        if len(batch) == batch_size:
            yield from tokenize(batch)
            batch = []
    if batch:
        yield from tokenize(batch)


def shard_file(split_name, index, count):
    """The file name of shard `index` of `count` of a split ("train", "train.<corpus>", "dev",
    "test"), which `SHARD_NAME` matches."""
    return f"{split_name}-{index:05d}-of-{count:05d}.tfrecord"


def _write_split(vocab, pairs, out_dir, name, num_shards, pair_filter=None):
    """Tokenizes pairs into `num_shards` TFRecord files named after `name`; -> the split's
    manifest entry. `pair_filter` (a `filters.PairFilter`) drops pairs and counts them."""
    names = [shard_file(name, i, num_shards) for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(os.path.join(out_dir, n + ".tmp")) for n in names]
    counts = [0] * num_shards
    histogram = collections.Counter()  # longest side incl. EOS/BOS -> number of pairs
    tokens = {"source": 0, "target": 0}
    if pair_filter is not None:
        pairs = (pair for pair in pairs if pair_filter.keep_text(*pair))
    tokenized = _tokenized_pairs(vocab, pairs)
    if pair_filter is not None:
        tokenized = (ids for ids in tokenized if pair_filter.keep_ids(*ids))
    try:
        for index, (source_ids, target_ids) in enumerate(tokenized):
            shard = index % num_shards  # round-robin keeps shards alike in length and content
            writers[shard].write(_serialize(source_ids, target_ids))
            counts[shard] += 1
            histogram[max(len(source_ids), len(target_ids)) + 1] += 1
            tokens["source"] += len(source_ids)
            tokens["target"] += len(target_ids)
        for writer in writers:
            writer.close()
    except BaseException:  # a bad line, a full disk, Ctrl-C: leave no partial shards behind
        for name, writer in zip(names, writers):
            with contextlib.suppress(Exception):
                writer.close()
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out_dir, name + ".tmp"))
        raise
    shards = []
    for name, count in zip(names, counts):
        path = os.path.join(out_dir, name)
        os.replace(path + ".tmp", path)
        shards.append({"file": name, "examples": count, "bytes": os.path.getsize(path),
                       "sha256": sha256_file(path)})
    return {"examples": sum(counts), "shards": shards, "tokens": tokens,
            "length_histogram": {str(k): v for k, v in sorted(histogram.items())}}


def _write_train(vocab, dataset, files, tfds_data_dir, out_dir, num_shards, filters,
                 reverse):
    """The train split: one set of shards per corpus (several `files["train"]` specs), the
    filters applied across all of them; -> its manifest entry, with "corpora" (each one's
    files, shards and pair count) when there are several, "filtered" (the counts) and
    "held_out" (how many dev and test pairs it holds too: `filters.HeldOutOverlap`)."""
    pair_filter = PairFilter(**(filters or {}))
    overlap = HeldOutOverlap(_held_out_pairs(dataset, files, tfds_data_dir, reverse))
    specs = corpus.train_specs(files) if dataset == "files" else [None]
    if len(specs) == 1:
        pairs = _split_pairs(dataset, "train", files, tfds_data_dir, reverse=reverse)
        entry = _write_split(vocab, overlap.passing(pairs), out_dir, "train", num_shards,
                             pair_filter)
    else:
        parts = []
        for index, spec in enumerate(specs):
            pairs = corpus.read_corpus(dataset, "train", spec, reverse=reverse)
            parts.append(_write_split(vocab, overlap.passing(pairs), out_dir, f"train.{index}",
                                      num_shards, pair_filter))
        histogram = collections.Counter()
        for part in parts:
            histogram.update({int(k): v for k, v in part["length_histogram"].items()})
        entry = {"examples": sum(p["examples"] for p in parts),
                 "shards": [s for p in parts for s in p["shards"]],
                 "tokens": {side: sum(p["tokens"][side] for p in parts)
                            for side in ("source", "target")},
                 "length_histogram": {str(k): v for k, v in sorted(histogram.items())},
                 "corpora": [{"files": spec, "examples": p["examples"],
                              "shards": [s["file"] for s in p["shards"]],
                              "length_histogram": p["length_histogram"]}
                             for spec, p in zip(specs, parts)]}
    entry["filtered"] = dict(pair_filter.dropped)
    entry["held_out"] = overlap.counts()
    return entry


def _held_out_pairs(dataset, files, tfds_data_dir, reverse):
    """{split: pairs} of the dev and test splits there are, as their records hold them."""
    held_out = {}
    for split in ("dev", "test"):
        if dataset == "files" and not (files or {}).get(split):
            continue
        try:
            held_out[split] = list(_split_pairs(dataset, split, files, tfds_data_dir,
                                                log_skipped=False, reverse=reverse))
        except corpus.CorpusError:
            continue  # writing the split names its bad line
    return held_out


def prepare(out_dir, dataset=corpus.EMBEDDED, files=None, tfds_data_dir=None, vocab_size=8000,
            vocab_type="unigram", train_shards=8, vocab_paths=None, model_vocab=None,
            filters=None, separate=False, reverse=False):
    """Learns the vocabulary on the train split and writes all splits as TFRecords, unless
    `out_dir` already holds them for the same input and settings (damaged shards are
    rewritten).

    Args:
      out_dir: the prepared-data directory.
      dataset, files, tfds_data_dir: the raw text, as for `corpus.read_corpus`.
      vocab_size, vocab_type: the SentencePiece model(s) to learn ("unigram" or "bpe"); with
        `separate`, each side's has `vocab_size` pieces.
      train_shards: TFRecord files for the train split.
      vocab_paths: (source, target) SentencePiece model files to use instead of learning them
        (the same path twice for a shared vocabulary).
      model_vocab: (source, target) files of the vocabulary of a model already trained on this
        data (its model_dir's). A rebuild then tokenizes with it instead of learning one again,
        which could differ (SentencePiece samples its input) and so no longer fit the model.
      filters: `filters.PairFilter` arguments for the train split (none by default).
      separate: learn one SentencePiece model per side (source text, target text) instead of
        one on both.
      reverse: translate the other way: each pair's second side is the source
        (`corpus.read_corpus`).

    Returns:
      The manifest (a dict: settings, vocabulary fingerprint, per-split shards, counts and
      length histograms, checksums).

    Raises:
      corpus.CorpusError: the raw text is missing or invalid.
      data_dir_lock.DataDirInUseError: `out_dir` must change, and another process reads it.
    """
    settings = data_settings(dataset, files, tfds_data_dir, vocab_size, vocab_type, train_shards,
                             vocab_paths, filters, separate, reverse)
    missing = [path for shas in settings["inputs"].get("files", {}).values()
               for path, sha in shas.items() if sha is None]
    if missing:  # before anything changes: the data prepared from it stays usable
        raise corpus.CorpusError(f"{missing[0]}: file not found")

    def make_split(vocab, split):
        return _write_any_split(vocab, dataset, split, files, tfds_data_dir, out_dir,
                                train_shards, filters, reverse)

    with data_dir_lock.preparing(out_dir) as claim:
        manifest = _up_to_date(out_dir, settings, claim, make_split, files)
        if manifest is not None:
            return manifest
        _check_writable(out_dir)
        if not vocab_paths and model_vocab and all(os.path.exists(p) for p in model_vocab):
            logging.warning("%s: tokenizing with the model's vocabulary %s", out_dir,
                            " and ".join(sorted(set(model_vocab))))
            vocab_paths = model_vocab
        # The vocabulary first: a failure to learn it leaves the data there complete.
        if vocab_paths:
            protos = vocabulary.read_protos(*vocab_paths)
        else:
            protos = _learn_vocabulary(dataset, files, tfds_data_dir, vocab_size, vocab_type,
                                       separate, out_dir, reverse)
        manifest_path = os.path.join(out_dir, MANIFEST)
        if os.path.exists(manifest_path):
            os.remove(manifest_path)  # from here on the directory reads as incomplete
        written = vocabulary.write_protos(out_dir, protos)
        vocab = Vocabulary(written["source"], written["target"])
        splits = {}
        for split in corpus.SPLITS:
            if dataset == "files" and not (files or {}).get(split):
                continue  # local files: dev/test are optional
            splits[split] = make_split(vocab, split)
            logging.info("%s: %d pairs", split, splits[split]["examples"])
        manifest = {"settings": settings, "vocab": _vocab_entry(vocab), "splits": splits}
        _write_manifest(manifest_path, manifest)
        _remove_other_shards(out_dir, manifest)
        return manifest


def _remove_other_shards(out_dir, manifest):
    """Removes the shards of earlier preparations that `manifest` does not name (another shard
    count, a split no longer given, a `.tmp` left by a killed process): only files named as
    this module names shards."""
    kept = {shard["file"] for split in manifest["splits"].values() for shard in split["shards"]}
    for name in os.listdir(out_dir):
        if SHARD_NAME.fullmatch(name) and name not in kept:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out_dir, name))


def data_settings(dataset=corpus.EMBEDDED, files=None, tfds_data_dir=None, vocab_size=8000,
                  vocab_type="unigram", train_shards=8, vocab_paths=None, filters=None,
                  separate=False, reverse=False):
    """The manifest's "settings" of the data `prepare` makes with these arguments (the same):
    what a reader waiting for that data checks the manifest against."""
    settings = {"format": FORMAT_VERSION, "dataset": dataset,
                "inputs": input_fingerprint(dataset, files, tfds_data_dir),
                "vocab_size": vocab_size, "vocab_type": vocab_type, "train_shards": train_shards,
                "vocab_source": _vocab_source(vocab_paths)}
    if separate:  # absent when shared: older data stays valid
        settings["separate_vocabularies"] = True
    if reverse:  # absent when not: older data stays valid
        settings["reverse"] = True
    if PairFilter(**(filters or {})).settings:  # absent when off: older data stays valid
        settings["filters"] = PairFilter(**filters).settings
    return settings


def _up_to_date(out_dir, settings, claim, make_split, files):
    """The manifest of `out_dir` when it holds the data of `settings`, its damaged splits
    rewritten first (`make_split(vocab, split)` -> the split's manifest entry), and its paths
    made `files`' when only they differ (the corpus moved); else None, once `claim`
    (data_dir_lock.preparing) allowed the directory to be rebuilt."""
    manifest_path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(manifest_path):
        claim("its prepared data is incomplete")
        return None
    try:
        manifest = load_manifest(out_dir, check_shards=False)  # damaged_shards does
    except PreparedDataError as error:
        claim(str(error))
        logging.warning("rebuilding %s: %s", out_dir, error)
        return None
    if not prepared_for(manifest, settings, files):
        if not moved_corpus(manifest, files, settings):
            differences = _differences(manifest["settings"], settings)
            claim("it holds data prepared with other settings ("
                  f"{differences or 'its train corpora in another order'})")
            return None
        claim("its corpus files moved")
        manifest = _with_moved_paths(manifest, files, settings)
        _write_manifest(manifest_path, manifest)
        logging.warning("%s: the corpus files moved (the same sha256 at other paths): its "
                        "prepared data is kept", out_dir)
    damaged = damaged_shards(out_dir, manifest)
    if not damaged:
        logging.info("%s is up to date", out_dir)
        return manifest
    splits = sorted({split for split, _ in damaged})
    claim(f"{damaged[0][1]}, to be rewritten")
    logging.warning("%s; rewriting the %s split%s with the same vocabulary",
                    "; ".join(problem for _, problem in damaged), " and ".join(splits),
                    "s" if len(splits) > 1 else "")
    os.remove(manifest_path)
    vocab = manifest_vocabulary(out_dir, manifest)
    for split in splits:
        manifest["splits"][split] = make_split(vocab, split)
    _write_manifest(manifest_path, manifest)
    return manifest


def _corpus_contents(files, shas):
    """{split: [[sha256 of each file] of each corpus]}: what a files dict's corpora hold,
    wherever their files are.

    Args:
      files: {split: spec or [spec, ...]} (a spec: a TSV path or "source,target").
      shas: {split: {path: sha256}}, `input_fingerprint`'s "files".
    """
    return {split: [[shas.get(split, {}).get(path) for path in (spec or "").split(",") if path]
                    for spec in corpus.train_specs({"train": specs})]
            for split, specs in (files or {}).items()}


def _prepared_files(manifest):
    """The files dict (paths as given then) that `manifest`'s data was prepared from."""
    shas = manifest["settings"]["inputs"].get("files") or {}
    files = {split: ",".join(paths) for split, paths in shas.items()}
    corpora = manifest["splits"].get("train", {}).get("corpora")
    if corpora:
        files["train"] = [entry["files"] for entry in corpora]
    return files


def _check_writable(out_dir):
    """Raises PreparedDataError where files cannot be created in `out_dir` (a read-only mount:
    prepared data is read from one, but none can be prepared there)."""
    if reason := cannot_write_in(out_dir):
        raise PreparedDataError(f"{out_dir}: the data must be prepared there, and no file can "
                                f"be written in it ({reason}): give a --data_dir that can be "
                                "written in")


def prepared_for(manifest, settings, files):
    """Whether `manifest`'s data is the data of `settings` (`data_settings`) from `files`: the
    same settings, and a "files" dataset's train corpora in the same order (the settings hold
    the files as {path: sha256} dicts, which compare equal in any order, and --train_weights
    binds to the order)."""
    if manifest["settings"] != settings:
        return False
    return settings["dataset"] != "files" or _corpus_contents(
        files, settings["inputs"]["files"]) == _corpus_contents(
        _prepared_files(manifest), manifest["settings"]["inputs"]["files"])


def moved_corpus(manifest, files, settings=None):
    """Whether `files` (a "files" dataset's {split: spec or [spec, ...]}) hold what the data of
    `manifest` was prepared from, at other paths (moved or copied since): the same splits,
    corpora and files per corpus, each file with the sha256 the manifest recorded, and (given
    `settings`, the data settings asked for) no other setting changed."""
    prepared = manifest["settings"]
    if prepared.get("dataset") != "files" or not files:
        return False
    shas = input_fingerprint("files", files)["files"] if settings is None \
        else settings["inputs"].get("files")
    if settings is not None and ({k: v for k, v in prepared.items() if k != "inputs"}
                                 != {k: v for k, v in settings.items() if k != "inputs"}):
        return False
    old = _prepared_files(manifest)
    return _corpus_contents(files, shas) == _corpus_contents(old, prepared["inputs"]["files"])


def _with_moved_paths(manifest, files, settings):
    """`manifest` with the paths of `files` (`moved_corpus`) instead of those it recorded."""
    manifest = dict(manifest, settings=settings, splits=dict(manifest["splits"]))
    corpora = manifest["splits"].get("train", {}).get("corpora")
    if corpora:
        specs = corpus.train_specs(files)
        manifest["splits"]["train"] = dict(manifest["splits"]["train"], corpora=[
            dict(entry, files=spec) for entry, spec in zip(corpora, specs)])
    return manifest


def _differences(prepared, asked):
    """The settings in which prepared data differs from the data asked for, for a message:
    "vocab_size 8000 there, 16000 asked; other input text"."""
    names = {"inputs": "other input text", "vocab_source": "another vocabulary"}
    return "; ".join(names.get(key) or f"{key} {prepared.get(key)!r} there, "
                     f"{asked.get(key)!r} asked"
                     for key in sorted(set(prepared) | set(asked))
                     if prepared.get(key) != asked.get(key))


def _vocab_source(vocab_paths):
    """What the manifest records of given vocabulary files: their sha256 (one string when
    shared, as before separate vocabularies), or "learned"."""
    if not vocab_paths:
        return "learned"
    source, target = vocab_paths
    if source == target:
        return sha256_file(source)
    return {"source": sha256_file(source), "target": sha256_file(target)}


def _learn_vocabulary(dataset, files, tfds_data_dir, vocab_size, vocab_type, separate,
                      work_dir, reverse):
    """Trains the SentencePiece model(s) on the train split (in `work_dir`); -> their
    `VocabularyProtos`."""
    def sentences(sides):  # the records' pass over the same pairs logs what it skips
        for pair in _split_pairs(dataset, "train", files, tfds_data_dir, log_skipped=False,
                                 reverse=reverse):
            for side in sides:
                yield pair[side]

    names = vocabulary.file_names(separate)
    learned = {}
    try:
        # The vocabulary that writes the targets keeps the forms they are written in.
        with contextlib.closing(sentences((1,))) as targets:
            normalization, changed = normalization_for(targets)
        if normalization != "nmt_nfkc":
            logging.warning("%s: learning the vocabulary without Unicode NFKC normalization: "
                            "it would rewrite %.0f%% of the training targets (fullwidth "
                            "punctuation such as '，' into ','), which the model could then "
                            "not write", work_dir, 100 * changed)
        for index, side in enumerate(("source", "target") if separate else ("source",)):
            path = os.path.join(work_dir, ".learned." + names[side])
            try:
                train_sentencepiece(sentences((index,) if separate else (0, 1)), path,
                                    vocab_size, vocab_type,
                                    normalization="nmt_nfkc" if separate and index == 0
                                    else normalization)
                with open(path, "rb") as f:
                    learned[side] = f.read()
            finally:
                with contextlib.suppress(OSError):
                    os.remove(path)
    except ValueError as error:
        raise corpus.CorpusError(str(error)) from None
    return vocabulary.as_protos((learned["source"], learned.get("target", learned["source"])))


def _vocab_entry(vocab):
    """The manifest's "vocab": file, fingerprint and size when shared (as before separate
    vocabularies), else each side's file and size and the combined fingerprint."""
    if vocab.shared:
        return {"file": vocabulary.VOCAB, "fingerprint": vocab.fingerprint,
                "size": vocab.source.vocab_size}
    return {"files": dict(vocabulary.SIDE_FILES), "fingerprint": vocab.fingerprint,
            "sizes": {"source": vocab.source.vocab_size, "target": vocab.target.vocab_size}}


def _manifest_vocab_paths(data_dir, manifest):
    entry = manifest["vocab"]
    if "file" in entry:
        return (os.path.join(data_dir, entry["file"]),) * 2
    return tuple(os.path.join(data_dir, entry["files"][side]) for side in ("source", "target"))


def manifest_vocabulary(data_dir, manifest):
    """The `Vocabulary` a prepared directory's records were tokenized with.

    Args:
      data_dir: a prepared directory.
      manifest: its manifest (`load_manifest`).
    """
    return Vocabulary(*_manifest_vocab_paths(data_dir, manifest))


def _write_any_split(vocab, dataset, split, files, tfds_data_dir, out_dir, train_shards,
                     filters, reverse):
    if split == "train":
        return _write_train(vocab, dataset, files, tfds_data_dir, out_dir, train_shards,
                            filters, reverse)
    return _write_split(vocab, _split_pairs(dataset, split, files, tfds_data_dir,
                                            reverse=reverse), out_dir, split, 1)


def _split_pairs(dataset, split, files, tfds_data_dir, log_skipped=True, reverse=False):
    return corpus.read_corpus(dataset, split, (files or {}).get(split), tfds_data_dir,
                              log_skipped, reverse)


def _write_manifest(path, manifest):
    write_atomically(path, json.dumps(manifest, indent=1))


def load_manifest(data_dir, vocab_fingerprint=None, check_shards=True):
    """The manifest of a complete prepared directory.

    Args:
      data_dir: a directory `prepare` wrote.
      vocab_fingerprint: also check that the records were made with this vocabulary.
      check_shards: check each shard's size (cheap; `damaged_shards` reads them against their
        checksums).

    Returns:
      The manifest dict.

    Raises:
      PreparedDataError: missing, incomplete or inconsistent.
    """
    path = os.path.join(data_dir, MANIFEST)
    if not os.path.exists(path):
        raise PreparedDataError(f"{data_dir} holds no complete prepared data (no {MANIFEST}); "
                                "run the preparation again")
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
        if manifest["settings"]["format"] != FORMAT_VERSION:
            raise PreparedDataError(f"{path} is of format {manifest['settings']['format']}, "
                                    f"this tfnmt reads {FORMAT_VERSION}")
        vocab_files = _manifest_vocab_paths(data_dir, manifest)
        expected_vocab = manifest["vocab"]["fingerprint"]
        shards = [(s["file"], s["bytes"], s["sha256"]) for split in manifest["splits"].values()
                  for s in split["shards"]]
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # JSONDecodeError too
        raise PreparedDataError(f"{path} is damaged ({type(error).__name__}: {error})")
    if vocabulary.readable_fingerprint(*vocab_files) != expected_vocab:
        raise PreparedDataError(f"{' or '.join(sorted(set(vocab_files)))} is missing or differs "
                                "from the vocabulary the records were made with")
    if vocab_fingerprint and vocab_fingerprint != expected_vocab:
        raise PreparedDataError(f"the records in {data_dir} were tokenized with another "
                                "vocabulary than the model's: prepare the data with the model's "
                                "SentencePiece model(s), or start a new model_dir")
    for name, size, _ in shards if check_shards else ():
        file = os.path.join(data_dir, name)
        if not os.path.exists(file) or os.path.getsize(file) != size:
            raise PreparedDataError(f"{file} is missing or not the size the manifest records")
    return manifest


def damaged_shards(data_dir, manifest):
    """The shards that are missing or whose bytes are not those the manifest records (each is read
    through sha256).

    Args:
      data_dir: a prepared directory.
      manifest: its manifest.

    Returns:
      [(split, "<file> is …")], one per damaged shard.
    """
    damaged = []
    for split, entry in sorted(manifest["splits"].items()):
        for shard in entry["shards"]:
            file = os.path.join(data_dir, shard["file"])
            if not os.path.exists(file):
                damaged.append((split, f"{file} is missing"))
            elif os.path.getsize(file) != shard["bytes"] or sha256_file(file) != shard["sha256"]:
                damaged.append((split, f"{file} is damaged (its checksum differs from the "
                                       "manifest's)"))
    return damaged


def shard_paths(data_dir, manifest, split):
    """A split's TFRecord files.

    Args:
      data_dir: a prepared directory.
      manifest: its manifest.
      split: "train", "dev" or "test".

    Returns:
      The shard paths.

    Raises:
      PreparedDataError: the split is not there.
    """
    if split not in manifest["splits"]:
        raise PreparedDataError(f"{data_dir} has no {split!r} split")
    return [os.path.join(data_dir, s["file"]) for s in manifest["splits"][split]["shards"]]
