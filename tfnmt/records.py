"""Tokenized splits as sharded TFRecord files of tf.train.Example, with a manifest.

A prepared directory holds `spm.model` (the shared vocabulary), `<split>-SSSSS-of-NNNNN.tfrecord`
shards and `manifest.json`, written last. Every file is written under a temporary name and renamed
when complete, and the old manifest is removed before anything is rewritten, so an interrupted
run leaves no manifest and is never read as complete. Re-running with the same inputs and
settings does nothing. Readers check the manifest against the vocabulary they tokenize with and
each shard's size, so a changed vocabulary or a truncated shard is an error, not mixed data.
"""
import collections
import hashlib
import json
import logging
import os

import tensorflow as tf

from tfnmt import corpus
from tfnmt.tokenizer import Tokenizer, train_sentencepiece

MANIFEST = "manifest.json"
VOCAB = "spm.model"
FORMAT_VERSION = 1


class PreparedDataError(RuntimeError):
    """A prepared-data directory that is missing, incomplete or inconsistent."""


def _sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def input_fingerprint(dataset, files=None, tfds_data_dir=None):
    """What the raw text is, so a changed input triggers a rebuild."""
    if dataset == corpus.EMBEDDED:
        paths = [os.path.join(corpus.EMBEDDED_DIR, f"{s}.tsv.gz") for s in corpus.SPLITS]
        return {"embedded": {os.path.basename(p): _sha256_file(p) for p in paths}}
    if dataset == "files":
        return {"files": {split: {p: _sha256_file(p) if os.path.exists(p) else None
                                  for p in (spec or "").split(",") if p}
                          for split, spec in sorted((files or {}).items())}}
    return {"tfds": dataset, "tfds_data_dir": tfds_data_dir}


def _serialize(source_ids, target_ids):
    feature = {
        "source": tf.train.Feature(int64_list=tf.train.Int64List(value=source_ids)),
        "target": tf.train.Feature(int64_list=tf.train.Int64List(value=target_ids)),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _tokenized_pairs(tokenizer, pairs, batch_size=2048):
    """Streams (source ids, target ids), tokenizing `batch_size` pairs per tf-text call."""
    def tokenize(batch):
        sources = tokenizer.tokenize([s for s, _ in batch]).to_list()
        targets = tokenizer.tokenize([t for _, t in batch]).to_list()
        return zip(sources, targets)

    batch = []
    for pair in pairs:
        batch.append(pair)
        if len(batch) == batch_size:
            yield from tokenize(batch)
            batch = []
    if batch:
        yield from tokenize(batch)


def _write_split(tokenizer, pairs, out_dir, split, num_shards):
    names = [f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(os.path.join(out_dir, n + ".tmp")) for n in names]
    counts = [0] * num_shards
    histogram = collections.Counter()  # longest side incl. EOS/BOS -> number of pairs
    tokens = {"source": 0, "target": 0}
    for index, (source_ids, target_ids) in enumerate(_tokenized_pairs(tokenizer, pairs)):
        shard = index % num_shards  # round-robin keeps shards alike in length and content
        writers[shard].write(_serialize(source_ids, target_ids))
        counts[shard] += 1
        histogram[max(len(source_ids), len(target_ids)) + 1] += 1
        tokens["source"] += len(source_ids)
        tokens["target"] += len(target_ids)
    shards = []
    for name, writer, count in zip(names, writers, counts):
        writer.close()
        os.replace(os.path.join(out_dir, name + ".tmp"), os.path.join(out_dir, name))
        shards.append({"file": name, "examples": count,
                       "bytes": os.path.getsize(os.path.join(out_dir, name))})
    return {"examples": sum(counts), "shards": shards, "tokens": tokens,
            "length_histogram": {str(k): v for k, v in sorted(histogram.items())}}


def prepare(out_dir, dataset=corpus.EMBEDDED, files=None, tfds_data_dir=None, vocab_size=8000,
            vocab_type="unigram", train_shards=8, vocab_path=None):
    """Learns the vocabulary on the train split (unless `vocab_path` is given) and writes all
    splits as TFRecords under `out_dir`. Returns the manifest (a dict)."""
    settings = {"format": FORMAT_VERSION, "dataset": dataset,
                "inputs": input_fingerprint(dataset, files, tfds_data_dir),
                "vocab_size": vocab_size, "vocab_type": vocab_type, "train_shards": train_shards,
                "vocab_source": _sha256_file(vocab_path) if vocab_path else "learned"}
    manifest_path = os.path.join(out_dir, MANIFEST)
    if os.path.exists(manifest_path):
        try:
            manifest = load_manifest(out_dir)
            if manifest["settings"] == settings:
                logging.info("%s is up to date", out_dir)
                return manifest
        except PreparedDataError as error:
            logging.warning("rebuilding %s: %s", out_dir, error)
        os.remove(manifest_path)  # from here on the directory reads as incomplete
    os.makedirs(out_dir, exist_ok=True)

    def split_files(split):
        return (files or {}).get(split)

    model_path = os.path.join(out_dir, VOCAB)
    if vocab_path:
        with open(vocab_path, "rb") as src, open(model_path + ".tmp", "wb") as dst:
            dst.write(src.read())
        os.replace(model_path + ".tmp", model_path)
    else:
        def sentences():
            for source, target in corpus.read_corpus(dataset, "train", split_files("train"),
                                                     tfds_data_dir):
                yield source
                yield target
        train_sentencepiece(sentences(), model_path, vocab_size, vocab_type)
    tokenizer = Tokenizer(model_path)

    splits = {}
    for split in corpus.SPLITS:
        if dataset == "files" and not split_files(split):
            continue  # local files: dev/test are optional
        pairs = corpus.read_corpus(dataset, split, split_files(split), tfds_data_dir)
        splits[split] = _write_split(tokenizer, pairs, out_dir, split,
                                     train_shards if split == "train" else 1)
        logging.info("%s: %d pairs", split, splits[split]["examples"])
    manifest = {"settings": settings, "vocab": {"file": VOCAB, "sha256": tokenizer.sha256,
                                                "size": tokenizer.vocab_size},
                "splits": splits}
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(manifest_path + ".tmp", manifest_path)
    return manifest


def load_manifest(data_dir, vocab_sha256=None):
    """The manifest of a complete prepared directory; PreparedDataError otherwise. With
    `vocab_sha256`, also checks the records were made with that vocabulary."""
    path = os.path.join(data_dir, MANIFEST)
    if not os.path.exists(path):
        raise PreparedDataError(f"{data_dir} holds no complete prepared data (no {MANIFEST}); "
                                "run the preparation again")
    with open(path) as f:
        manifest = json.load(f)
    vocab_file = os.path.join(data_dir, manifest["vocab"]["file"])
    if not os.path.exists(vocab_file) or _sha256_file(vocab_file) != manifest["vocab"]["sha256"]:
        raise PreparedDataError(f"{vocab_file} is missing or differs from the vocabulary the "
                                "records were made with")
    if vocab_sha256 and vocab_sha256 != manifest["vocab"]["sha256"]:
        raise PreparedDataError(f"the records in {data_dir} were tokenized with another "
                                "vocabulary than the model's: prepare the data with the model's "
                                "spm.model, or start a new model_dir")
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            file = os.path.join(data_dir, shard["file"])
            if not os.path.exists(file) or os.path.getsize(file) != shard["bytes"]:
                raise PreparedDataError(f"{file} is missing or not the size the manifest records")
    return manifest


def shard_paths(data_dir, manifest, split):
    if split not in manifest["splits"]:
        raise PreparedDataError(f"{data_dir} has no {split!r} split")
    return [os.path.join(data_dir, s["file"]) for s in manifest["splits"][split]["shards"]]
