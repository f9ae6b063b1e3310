"""Separate source/target vocabularies (vocabulary.py, records.prepare(separate=True)): each side
learned on its own text, records tokenized side by side (checked against the sentencepiece
package), manifest checks, repair and layout changes."""
import json
import os
import shutil

import pytest
import sentencepiece
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2

from helpers import piece_counts
from tfnmt.data import records, vocabulary
from tfnmt.data.tokenizer import file_fingerprint
from tfnmt.paths import VOCAB, DamagedFileError

SIDE_FILES = ["source.spm.model", "target.spm.model"]


def processors(directory):
    return [sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, name))
            for name in SIDE_FILES]


def pieces(processor):
    return {processor.id_to_piece(i) for i in range(processor.get_piece_size())}


def split_ids(data_dir, split):
    manifest = records.load_manifest(data_dir)
    for raw in tf.data.TFRecordDataset(records.shard_paths(data_dir, manifest, split)):
        features = tf.train.Example.FromString(raw.numpy()).features.feature
        yield (list(features["source"].int64_list.value),
               list(features["target"].int64_list.value))


def test_each_side_has_its_own_vocabulary_learned_on_its_own_text(separate_prepared,
                                                                  small_corpus):
    assert VOCAB not in os.listdir(separate_prepared)
    assert set(SIDE_FILES) <= set(os.listdir(separate_prepared))
    source, target = processors(separate_prepared)
    assert source.get_piece_size() == target.get_piece_size() == 500
    # German words in the source pieces only, English ones in the target's only.
    assert {"▁der", "▁sprach"} <= pieces(source) and not {"▁der", "▁sprach"} & pieces(target)
    assert {"▁the", "▁said"} <= pieces(target) and not {"▁the", "▁said"} & pieces(source)
    # Every dev pair's records are its sides tokenized by their own model.
    with open(small_corpus["dev"], encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t")[:2] for line in f]
    stored = list(split_ids(separate_prepared, "dev"))
    assert len(stored) == len(pairs) == 200
    for (german, english), (source_ids, target_ids) in zip(pairs, stored):
        assert source_ids == source.encode(german)
        assert target_ids == target.encode(english)


def test_the_manifest_records_both_sides(separate_prepared):
    manifest = records.load_manifest(separate_prepared)
    entry = manifest["vocab"]
    assert entry["files"] == dict(zip(("source", "target"), SIDE_FILES))
    assert entry["sizes"] == {"source": 500, "target": 500}
    fingerprints = [file_fingerprint(os.path.join(separate_prepared, n)) for n in SIDE_FILES]
    assert fingerprints[0] != fingerprints[1]
    assert entry["fingerprint"] not in fingerprints
    assert entry["fingerprint"] == vocabulary.combined_fingerprint(*fingerprints)
    loaded = records.manifest_vocabulary(separate_prepared, manifest)
    assert not loaded.shared and loaded.fingerprint == entry["fingerprint"]
    assert loaded.model_sizes() == {"vocab_size": None, "source_vocab_size": 500,
                                    "target_vocab_size": 500}


def test_a_shared_vocabulary_keeps_the_fingerprint_of_its_one_model(small_prepared, tmp_path):
    # Model_dirs and prepared data written before separate vocabularies existed stay valid.
    path = os.path.join(small_prepared, VOCAB)
    shared = vocabulary.Vocabulary(path, path)
    assert shared.shared and shared.source is shared.target
    assert shared.fingerprint == file_fingerprint(path)
    assert shared.fingerprint == records.load_manifest(small_prepared)["vocab"]["fingerprint"]
    assert shared.model_sizes() == {"vocab_size": 600}
    with open(path, "rb") as f:
        proto = f.read()
    assert vocabulary.as_protos(proto).shared
    # The same model with the paths of the machine that trained it (as a model file given with
    # --vocab may hold): other bytes, one model, so still shared and of the one fingerprint.
    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    model.trainer_spec.model_prefix = "/elsewhere/spm"
    with_paths = vocabulary.as_protos((proto, model.SerializeToString()))
    assert with_paths.source != with_paths.target
    assert with_paths.shared and with_paths.fingerprint == shared.fingerprint
    copy = tmp_path / "copied.spm.model"
    copy.write_bytes(model.SerializeToString())
    copied = vocabulary.Vocabulary(path, str(copy))
    assert copied.shared and copied.model_sizes() == {"vocab_size": 600}


def test_a_model_file_without_pieces_is_named_as_damaged(tmp_path):
    # An empty file parses as a SentencePiece model of no pieces: refused in one line, not
    # left to fail inside tensorflow-text.
    empty = tmp_path / "spm.model"
    empty.write_bytes(b"")
    with pytest.raises(DamagedFileError, match=r"spm.model is not a SentencePiece model \(it "
                                               r"holds no pieces\)"):
        vocabulary.read_protos(str(empty), str(empty))


@pytest.mark.parametrize("name", SIDE_FILES)
def test_either_side_changed_is_detected(separate_prepared, tmp_path, name):
    out = str(tmp_path / "copy")
    shutil.copytree(separate_prepared, out)
    with open(os.path.join(out, name), "ab") as f:
        f.write(b"x")
    with pytest.raises(records.PreparedDataError, match="differs from the vocabulary"):
        records.load_manifest(out)
    os.remove(os.path.join(out, name))
    with pytest.raises(records.PreparedDataError, match="is missing or differs"):
        records.load_manifest(out)


def test_a_damaged_shard_is_rewritten_with_both_vocabularies(separate_prepared, small_corpus,
                                                             tmp_path):
    out = str(tmp_path / "copy")
    shutil.copytree(separate_prepared, out)
    before = records.load_manifest(out)
    shard = records.shard_paths(out, before, "train")[1]
    with open(shard, "r+b") as f:
        f.seek(100)
        f.write(b"\x00" * 50)
    assert records.damaged_shards(out, before)
    after = records.prepare(out, dataset="files", files=small_corpus, vocab_size=500,
                            train_shards=2, separate=True)
    assert after["vocab"] == before["vocab"]
    assert after["splits"]["train"]["shards"] == before["splits"]["train"]["shards"]
    assert not records.damaged_shards(out, after)


def test_changing_the_layout_rebuilds_and_leaves_only_its_files(separate_prepared, small_corpus,
                                                               tmp_path):
    out = str(tmp_path / "copy")
    shutil.copytree(separate_prepared, out)
    shared = records.prepare(out, dataset="files", files=small_corpus, vocab_size=500,
                             train_shards=2)
    assert VOCAB in os.listdir(out) and not set(SIDE_FILES) & set(os.listdir(out))
    assert shared["vocab"]["file"] == VOCAB and shared["vocab"]["size"] == 500
    processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(out, VOCAB))
    assert {"▁der", "▁the"} <= pieces(processor)  # learned on both sides
    again = records.prepare(out, dataset="files", files=small_corpus, vocab_size=500,
                            train_shards=2, separate=True)
    assert VOCAB not in os.listdir(out) and set(SIDE_FILES) <= set(os.listdir(out))
    assert set(again["vocab"]["files"].values()) == set(SIDE_FILES)
    with open(os.path.join(out, records.MANIFEST)) as f:
        assert json.load(f)["settings"]["separate_vocabularies"] is True


def test_writing_a_vocabulary_leaves_its_files_and_no_others(separate_prepared, small_prepared,
                                                             tmp_path):
    # A model_dir's vocabulary files say its layout: writing one layout over the other leaves
    # that layout's files, byte for byte, and nothing else (no other layout's, no temporary).
    def read(path):
        with open(path, "rb") as f:
            return f.read()

    shared = read(os.path.join(small_prepared, VOCAB))
    sides = [read(os.path.join(separate_prepared, name)) for name in SIDE_FILES]
    directory = tmp_path / "model"
    directory.mkdir()
    for protos, files in ((shared, {VOCAB: shared}),
                          (tuple(sides), dict(zip(SIDE_FILES, sides))),
                          ((shared, shared), {VOCAB: shared})):
        vocabulary.write_protos(str(directory), protos)
        assert {name: read(directory / name) for name in os.listdir(directory)} == files


def test_given_vocabularies_are_used_as_they_are(separate_prepared, small_corpus, tmp_path):
    # As fine-tuning does: new data tokenized with another run's two models.
    given = tuple(os.path.join(separate_prepared, n) for n in SIDE_FILES)
    out = str(tmp_path / "new")
    manifest = records.prepare(out, dataset="files", files={"train": small_corpus["dev"]},
                               vocab_size=123, vocab_paths=given, train_shards=1)
    assert manifest["vocab"]["fingerprint"] == records.load_manifest(
        separate_prepared)["vocab"]["fingerprint"]
    for name in SIDE_FILES:
        with open(os.path.join(out, name), "rb") as a, \
                open(os.path.join(separate_prepared, name), "rb") as b:
            assert a.read() == b.read()
    assert list(split_ids(out, "train")) == list(split_ids(separate_prepared, "dev"))


def test_a_given_model_must_reserve_tfnmt_ids(small_prepared, small_corpus, tmp_path):
    vocabulary.check_given_model(os.path.join(small_prepared, VOCAB))  # tfnmt's own: taken
    # SentencePiece's defaults (no PAD, UNK 0, BOS 1, EOS 2) would read ids 0-3 as other
    # tokens than the model's PAD, UNK, BOS and EOS.
    with open(small_corpus["dev"], encoding="utf-8") as f:
        text = [line.split("\t")[0] for line in f]
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(text), vocab_size=300,
                                             model_prefix=str(tmp_path / "default"))
    with pytest.raises(ValueError, match=r"reserves other ids \(pad_id -1, unk_id 0, bos_id 1, "
                                         r"eos_id 2\) than tfnmt's: train it with --pad_id=0 "
                                         r"--unk_id=1 --bos_id=2 --eos_id=3"):
        vocabulary.check_given_model(str(tmp_path / "default.model"))
    with pytest.raises(ValueError, match="is not a SentencePiece model"):
        vocabulary.check_given_model(small_corpus["dev"])
    with pytest.raises(ValueError, match="file not found"):
        vocabulary.check_given_model(str(tmp_path / "missing.model"))
    with pytest.raises(ValueError, match="is a directory"):
        vocabulary.check_given_model(str(tmp_path))


def test_train_py_tokenizes_with_the_given_models(separate_prepared, small_corpus, tmp_path):
    from helpers import python, train_flags

    given = [os.path.join(separate_prepared, name) for name in SIDE_FILES]
    model_dir = str(tmp_path / "run")
    result = python(*train_flags(small_corpus, None, model_dir, vocab_size=None, train_steps=2,
                                 eval_every=0, average_last=0, test_report="false"),
                    f"--vocab={','.join(given)}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "vocabulary 500 source, 500 target" in result.stdout
    with open(os.path.join(model_dir, "settings.json")) as f:
        data = json.load(f)["data"]
    assert data["vocab"] == given and data["separate_vocabularies"]
    for name, path in zip(SIDE_FILES, given):  # the model_dir holds them as they are
        with open(os.path.join(model_dir, name), "rb") as a, open(path, "rb") as b:
            assert a.read() == b.read()
    # The dev records: each side as the sentencepiece package tokenizes it with its model.
    source_sp, target_sp = processors(separate_prepared)
    with open(small_corpus["dev"], encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t")[:2] for line in f]
    expected = [(source_sp.encode(s), target_sp.encode(t)) for s, t in pairs]
    assert list(split_ids(os.path.join(model_dir, "data"), "dev")) == expected


def test_side_models_given_the_other_way_round_are_told_apart(separate_prepared, small_prepared,
                                                              small_corpus):
    # The small corpus is German -> English, and its two models were learned on one side each:
    # each language takes far fewer pieces with its own model. One model for both sides, or
    # the models in their order, are not taken for swapped.
    source, target = (os.path.join(separate_prepared, name) for name in SIDE_FILES)
    with open(small_corpus["train"], encoding="utf-8") as f:
        pairs = [tuple(line.rstrip("\n").split("\t")[:2]) for line in f][:300]
    german, english = [s for s, _ in pairs], [t for _, t in pairs]
    assert vocabulary.swapped_side_models(source, target, pairs) is None
    evidence = vocabulary.swapped_side_models(target, source, pairs)
    assert evidence == {"source": (piece_counts(target, german), piece_counts(source, german)),
                        "target": (piece_counts(source, english), piece_counts(target, english))}
    assert all(other <= 0.75 * own for own, other in evidence.values())
    reversed_pairs = [(t, s) for s, t in pairs]  # English -> German wants them the other way
    assert vocabulary.swapped_side_models(source, target, reversed_pairs) is not None
    assert vocabulary.swapped_side_models(target, source, reversed_pairs) is None
    assert vocabulary.swapped_side_models(source, source, pairs) is None
    # A model of the target language given for the source beside one of both languages: the
    # source side fits the other model far better, the target side does not. Not a swap.
    shared = os.path.join(small_prepared, VOCAB)
    assert piece_counts(shared, german) <= 0.75 * piece_counts(target, german)
    assert vocabulary.swapped_side_models(target, shared, pairs) is None
    assert vocabulary.swapped_side_models(target, source, []) is None


def test_train_py_refuses_side_models_given_the_other_way_round(separate_prepared, small_corpus,
                                                                tmp_path):
    # With --reverse the English side is the source: its model comes first. The given order is
    # refused in one line before TensorFlow loads, with the pieces of the first 1,000 pairs
    # (counted with the sentencepiece package) and the order to give.
    from absl import app
    from absl.testing import flagsaver

    from helpers import imported_modules, python
    from tfnmt.programs import train, train_data_checks

    german_model, english_model = (os.path.join(separate_prepared, name) for name in SIDE_FILES)
    flags = [f"--model_dir={tmp_path / 'run'}", f"--train_files={small_corpus['train']}",
             f"--dev_files={small_corpus['dev']}", "--reverse",
             f"--vocab={german_model},{english_model}"]
    result = python("train.py", *flags, timeout=60, env={"PYTHONPROFILEIMPORTTIME": "1"})
    with open(small_corpus["train"], encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t")[:2] for line in f][:1000]
    english, german = [t for _, t in pairs], [s for s, _ in pairs]
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"train.py: --vocab={german_model},{english_model}: the models look given the other way "
        "round: the source side's comes first (with --reverse the source is the second side of "
        f"--train_files), and the first 1,000 training sources take "
        f"{piece_counts(german_model, english):,d} pieces with {german_model} but "
        f"{piece_counts(english_model, english):,d} with {english_model}, the targets "
        f"{piece_counts(english_model, german):,d} with {english_model} but "
        f"{piece_counts(german_model, german):,d} with {german_model}: give "
        f"--vocab={english_model},{german_model}")
    assert "tensorflow" not in imported_modules(result.stderr)
    assert not (tmp_path / "run").exists()
    # A run under way (a checkpoint in its model_dir) keeps the models it trains with.
    with flagsaver.flagsaver():
        train.FLAGS.unparse_flags()
        train.FLAGS(["train.py", *flags])
        with pytest.raises(app.UsageError, match="look given the other way round"):
            train_data_checks.check_vocab_order()
        (tmp_path / "run" / "checkpoints").mkdir(parents=True)
        (tmp_path / "run" / "checkpoints" / "ckpt-8.index").touch()
        train_data_checks.check_vocab_order()
