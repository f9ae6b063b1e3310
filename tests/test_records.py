import json
import os

import pytest
import tensorflow as tf

from tfnmt.data import records
from tfnmt.data.corpus import CorpusError
from tfnmt.data.tokenizer import Tokenizer
from tfnmt.paths import VOCAB


def test_manifest_counts_and_shards(small_prepared):
    manifest = records.load_manifest(small_prepared)
    assert manifest["splits"]["train"]["examples"] == 3000
    assert manifest["splits"]["dev"]["examples"] == 200
    assert "test" not in manifest["splits"]
    assert len(manifest["splits"]["train"]["shards"]) == 4
    files = records.shard_paths(small_prepared, manifest, "train")
    assert sum(1 for _ in tf.data.TFRecordDataset(files)) == 3000
    # Pairs are dealt round-robin: input pipelines that each read whole shards (one per
    # worker) get equal shares.
    assert [s["examples"] for s in manifest["splits"]["train"]["shards"]] == [750] * 4
    assert [sum(1 for _ in tf.data.TFRecordDataset(f)) for f in files] == [750] * 4
    histogram = manifest["splits"]["train"]["length_histogram"]
    assert sum(histogram.values()) == 3000


def test_records_hold_the_tokenized_text(small_corpus, small_prepared):
    tokenizer = Tokenizer(os.path.join(small_prepared, VOCAB))
    manifest = records.load_manifest(small_prepared)
    raw = next(iter(tf.data.TFRecordDataset(records.shard_paths(small_prepared, manifest, "dev"))))
    example = tf.train.Example.FromString(raw.numpy())
    source = list(example.features.feature["source"].int64_list.value)
    with open(small_corpus["dev"], encoding="utf-8") as f:
        german = f.readline().split("\t")[0]
    assert source == tokenizer.tokenize([german]).to_list()[0]


def test_reversed_data_holds_the_second_side_as_source_and_rebuilds_when_turned(
        small_corpus, tmp_path):
    import sentencepiece

    out = str(tmp_path / "prep")
    with open(small_corpus["dev"], encoding="utf-8") as f:
        german, english = f.readline().rstrip("\n").split("\t")[:2]
    for reverse, (source, target) in ((True, (english, german)), (False, (german, english))):
        manifest = records.prepare(out, dataset="files", files=small_corpus, vocab_size=600,
                                   train_shards=1, reverse=reverse)
        assert manifest["settings"].get("reverse", False) is reverse  # turned: rebuilt
        pieces = sentencepiece.SentencePieceProcessor(model_file=os.path.join(out, VOCAB))
        raw = next(iter(tf.data.TFRecordDataset(records.shard_paths(out, manifest, "dev"))))
        example = tf.train.Example.FromString(raw.numpy()).features.feature
        assert list(example["source"].int64_list.value) == pieces.encode(source)
        assert list(example["target"].int64_list.value) == pieces.encode(target)


def test_a_run_reading_the_data_keeps_another_from_changing_it(small_corpus, tmp_path):
    # Runs may share a prepared directory (train.py --data_dir). While one reads it, another
    # with the same settings uses it as it is, and one with other settings is refused instead
    # of rewriting the records under it. A vocabulary that cannot be learned changes nothing.
    import hashlib
    import subprocess
    import sys

    from helpers import ROOT
    from tfnmt.data.data_dir_lock import DataDirInUseError, release

    out = str(tmp_path / "shared")
    files = dict(small_corpus)

    def contents():
        return {name: hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
                for name in os.listdir(out) if not name.startswith(".")}

    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tfnmt.data import records; "
         "records.prepare(sys.argv[1], dataset='files', files={'train': sys.argv[2], "
         "'dev': sys.argv[3]}, vocab_size=600, train_shards=1); print('reading', flush=True); "
         "sys.stdin.readline()", out, files["train"], files["dev"]],
        cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert reader.stdout.readline() == "reading\n", reader.stderr.read()[-3000:]
        before = contents()
        assert {"manifest.json", "spm.model", "train-00000-of-00001.tfrecord"} <= set(before)
        same = records.prepare(out, dataset="files", files=files, vocab_size=600,
                               train_shards=1)
        assert same["vocab"]["size"] == 600 and contents() == before
        with pytest.raises(DataDirInUseError, match=r"shared: it holds data prepared with other "
                           r"settings \(vocab_size 600 there, 500 asked\), and another training "
                           r"run is reading it"):
            records.prepare(out, dataset="files", files=files, vocab_size=500, train_shards=1)
        assert contents() == before
    finally:
        reader.stdin.close()
        reader.wait(timeout=60)
    with pytest.raises(CorpusError, match="needs at least"):
        records.prepare(out, dataset="files", files=files, vocab_size=100, train_shards=1)
    assert contents() == before
    assert records.load_manifest(out)["vocab"]["size"] == 600
    # No one else reads it now: other settings rebuild it.
    assert records.prepare(out, dataset="files", files=files, vocab_size=500,
                           train_shards=1)["vocab"]["size"] == 500
    assert contents()["spm.model"] != before["spm.model"]
    release(out)  # this process's hold (each prepare leaves one, until release or exit)


def test_a_worker_takes_only_the_data_of_its_own_settings(small_corpus, small_prepared):
    # A cluster's other workers read what the chief has prepared, if it is the data of their
    # own settings and corpus files as they see them.
    from tfnmt.training.experiment import _prepared_by_chief

    wanted = records.data_settings(dataset="files", files=small_corpus, vocab_size=600,
                                   train_shards=4)
    assert _prepared_by_chief(small_prepared, wanted, small_corpus) == \
        records.load_manifest(small_prepared)
    with pytest.raises(records.PreparedDataError, match="other settings than this worker's"):
        _prepared_by_chief(small_prepared, dict(wanted, vocab_size=500), small_corpus)


def test_a_missing_input_file_leaves_the_prepared_data_usable(small_corpus, tmp_path):
    # A corpus file moved or deleted after its data was prepared: preparing again stops with
    # the file's name before anything in the directory changes (a resumed run then trains on
    # it once the file is given at its new path).
    import shutil

    files = {split: str(tmp_path / f"{split}.tsv") for split in ("train", "dev")}
    for split, path in files.items():
        shutil.copy(small_corpus[split], path)
    out = str(tmp_path / "prep")
    manifest = records.prepare(out, dataset="files", files=files, vocab_size=600,
                               train_shards=1)
    before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    model_vocab = (str(tmp_path / "spm.model"),) * 2  # a trained model's, as a resume gives
    shutil.copy(os.path.join(out, VOCAB), model_vocab[0])
    os.remove(files["train"])
    with pytest.raises(CorpusError, match=f"^{files['train']}: file not found$"):
        records.prepare(out, dataset="files", files=files, vocab_size=600, train_shards=1,
                        model_vocab=model_vocab)
    assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == \
        before
    assert records.load_manifest(out) == manifest


def copy_prepared(src, dst):
    os.makedirs(dst)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as a, open(os.path.join(dst, name), "wb") as b:
            b.write(a.read())


def test_rerun_is_a_no_op(small_corpus, small_prepared):
    before = {n: os.stat(os.path.join(small_prepared, n)).st_mtime_ns
              for n in os.listdir(small_prepared)}
    records.prepare(small_prepared, dataset="files", files=small_corpus, vocab_size=600,
                    train_shards=4)
    after = {n: os.stat(os.path.join(small_prepared, n)).st_mtime_ns
             for n in os.listdir(small_prepared)}
    assert before == after


def test_interrupted_run_never_reads_as_complete(small_corpus, tmp_path, monkeypatch):
    out = str(tmp_path / "prep")
    calls = []

    def failing_tokenized(*args, **kwargs):
        calls.append(1)
        for index, ids in enumerate(real_tokenized(*args, **kwargs)):
            if len(calls) == 2 and index == 10:
                raise KeyboardInterrupt  # killed while writing the second split's shards
            yield ids

    real_tokenized = records._tokenized_pairs
    monkeypatch.setattr(records, "_tokenized_pairs", failing_tokenized)
    with pytest.raises(KeyboardInterrupt):
        records.prepare(out, dataset="files", files=small_corpus, vocab_size=600)
    assert len(calls) == 2
    # The first split's shards stay; the second's partial ones are removed, not left to fill
    # the disk.
    assert [n for n in os.listdir(out) if n.endswith(".tfrecord")]
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    with pytest.raises(records.PreparedDataError, match="no complete prepared data"):
        records.load_manifest(out)
    monkeypatch.setattr(records, "_tokenized_pairs", real_tokenized)
    manifest = records.prepare(out, dataset="files", files=small_corpus, vocab_size=600)
    assert manifest["splits"]["dev"]["examples"] == 200
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    # A rebuild (other settings) interrupted the same way: the complete data's manifest went
    # first, so what is left does not read as complete either.
    calls.clear()
    monkeypatch.setattr(records, "_tokenized_pairs", failing_tokenized)
    with pytest.raises(KeyboardInterrupt):
        records.prepare(out, dataset="files", files=small_corpus, vocab_size=500)
    with pytest.raises(records.PreparedDataError, match="no complete prepared data"):
        records.load_manifest(out)


def test_the_shard_pattern_matches_every_shard_name_and_no_other_file():
    # What a rebuild may remove (SHARD_NAME) is what shard_file names, at any shard count.
    for split in ("train", "train.0", "train.12", "dev", "test"):
        for index, count in ((0, 1), (7, 8), (123456, 200000)):
            name = records.shard_file(split, index, count)
            assert name.startswith(f"{split}-") and name.endswith(".tfrecord")
            assert records.SHARD_NAME.fullmatch(name)
            assert records.SHARD_NAME.fullmatch(name + ".tmp")
    for other in ("notes.txt", "train-1-of-2.tfrecord", "valid-00000-of-00001.tfrecord",
                  "train-00000-of-00001.tfrecord.bak", "manifest.json"):
        assert not records.SHARD_NAME.fullmatch(other), other


def test_a_rebuild_leaves_only_the_shards_its_manifest_names(small_corpus, small_prepared,
                                                            tmp_path):
    out = str(tmp_path / "copy")
    copy_prepared(small_prepared, out)  # 4 train shards and a dev shard
    for name in ("test-00000-of-00001.tfrecord.tmp", "notes.txt"):  # left by a killed run; yours
        (tmp_path / "copy" / name).write_text("x")
    manifest = records.prepare(out, dataset="files", files={"train": small_corpus["train"]},
                               vocab_size=600, train_shards=2)
    shards = {shard["file"] for split in manifest["splits"].values()
              for shard in split["shards"]}
    assert shards == {"train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"}
    assert set(os.listdir(out)) - {".prepare.lock", ".in_use.lock"} == \
        shards | {records.MANIFEST, "spm.model", "notes.txt"}
    assert records.load_manifest(out)["splits"]["train"]["examples"] == 3000


def test_truncated_shard_is_detected(small_prepared, tmp_path):
    out = str(tmp_path / "copy")
    copy_prepared(small_prepared, out)
    shard = records.shard_paths(out, records.load_manifest(out), "train")[0]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(records.PreparedDataError, match="not the size"):
        records.load_manifest(out)


def test_vocabulary_change_is_detected(small_prepared, tmp_path):
    manifest = records.load_manifest(small_prepared)
    with pytest.raises(records.PreparedDataError, match="another vocabulary"):
        records.load_manifest(small_prepared, vocab_fingerprint="0" * 64)
    out = str(tmp_path / "copy")
    copy_prepared(small_prepared, out)
    with open(os.path.join(out, VOCAB), "ab") as f:
        f.write(b"x")  # the vocabulary file no longer matches the records
    with pytest.raises(records.PreparedDataError, match="differs from the vocabulary"):
        records.load_manifest(out)
    assert manifest["vocab"]["size"] == 600


def test_data_of_another_format_is_named_as_such(small_prepared, tmp_path):
    # Prepared by a tfnmt whose records differ: refused as such (preparation then rebuilds it).
    out = str(tmp_path / "copy")
    copy_prepared(small_prepared, out)
    with open(os.path.join(out, records.MANIFEST)) as f:
        manifest = json.load(f)
    manifest["settings"]["format"] = records.FORMAT_VERSION - 1
    with open(os.path.join(out, records.MANIFEST), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(records.PreparedDataError) as error:
        records.load_manifest(out)
    assert str(error.value) == (f"{os.path.join(out, records.MANIFEST)} is of format "
                                f"{records.FORMAT_VERSION - 1}, this tfnmt reads "
                                f"{records.FORMAT_VERSION}")


def test_changed_input_triggers_rebuild(small_corpus, tmp_path):
    out = str(tmp_path / "prep")
    files = {"train": str(tmp_path / "train.tsv")}
    with open(small_corpus["train"], encoding="utf-8") as f:
        lines = f.readlines()
    (tmp_path / "train.tsv").write_text("".join(lines[:1000]), encoding="utf-8")
    first = records.prepare(out, dataset="files", files=files, vocab_size=600)
    (tmp_path / "train.tsv").write_text("".join(lines[:1200]), encoding="utf-8")
    second = records.prepare(out, dataset="files", files=files, vocab_size=600)
    assert (first["splits"]["train"]["examples"], second["splits"]["train"]["examples"]) == (
        1000, 1200)
    with open(os.path.join(out, records.MANIFEST)) as f:
        assert json.load(f)["splits"]["train"]["examples"] == 1200


def test_a_moved_corpus_keeps_its_prepared_data(small_corpus, tmp_path):
    # The corpus files moved (same bytes, other paths): the data is neither tokenized again nor
    # its vocabulary learned again; the manifest names the new paths (also per corpus of a
    # mixed train split). Other bytes, another arrangement of the same files, or another
    # setting beside the move, rebuild.
    import shutil

    with open(small_corpus["train"], encoding="utf-8") as f:
        lines = f.readlines()
    first = {"a": "".join(lines[:600]), "b": "".join(lines[600:1000])}
    for name, text in first.items():
        (tmp_path / f"{name}.tsv").write_text(text, encoding="utf-8")
    old = {"train": [str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv")],
           "dev": small_corpus["dev"]}
    out = str(tmp_path / "prep")
    prepared = records.prepare(out, dataset="files", files=old, vocab_size=600, train_shards=1)
    written = {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in os.listdir(out)}
    (tmp_path / "moved").mkdir()
    new = {"train": [str(tmp_path / "moved" / "a.tsv"), str(tmp_path / "moved" / "b.tsv")],
           "dev": str(tmp_path / "moved" / "dev.tsv")}
    for source, target in zip(old["train"] + [old["dev"]], new["train"] + [new["dev"]]):
        shutil.copy(source, target)
    for path in old["train"]:
        os.remove(path)
    moved = records.prepare(out, dataset="files", files=new, vocab_size=600, train_shards=1)
    assert {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in os.listdir(out)
            if name != records.MANIFEST} == {k: v for k, v in written.items()
                                             if k != records.MANIFEST}
    assert moved == records.load_manifest(out)
    assert moved["settings"]["inputs"]["files"]["train"] == {
        path: prepared["settings"]["inputs"]["files"]["train"][before]
        for path, before in zip(new["train"], old["train"])}
    assert [c["files"] for c in moved["splits"]["train"]["corpora"]] == new["train"]
    assert moved["vocab"] == prepared["vocab"]
    assert [c["examples"] for c in moved["splits"]["train"]["corpora"]] == [600, 400]
    # Not a move: the corpora swapped, one of them changed, or a vocabulary size changed.
    swapped = dict(new, train=new["train"][::-1])
    assert not records.moved_corpus(moved, swapped)
    assert records.moved_corpus(moved, new)
    rebuilt = records.prepare(out, dataset="files", files=swapped, vocab_size=600,
                              train_shards=1)
    assert [c["examples"] for c in rebuilt["splits"]["train"]["corpora"]] == [400, 600]
    # A cluster's worker waits for its own order of the corpora too.
    from tfnmt.training.experiment import _prepared_by_chief

    wanted = records.data_settings(dataset="files", files=new, vocab_size=600, train_shards=1)
    assert _prepared_by_chief(out, wanted, swapped) == rebuilt
    with pytest.raises(records.PreparedDataError, match="other settings than this worker's"):
        _prepared_by_chief(out, wanted, new)
    with open(new["train"][0], "a", encoding="utf-8") as f:
        f.write("Noch ein Satz.\tOne more sentence.\n")
    assert not records.moved_corpus(rebuilt, swapped)
    assert records.prepare(out, dataset="files", files=swapped, vocab_size=600, train_shards=1)[
        "splits"]["train"]["corpora"][1]["examples"] == 601
    before = os.stat(os.path.join(out, VOCAB)).st_mtime_ns
    again = {"train": [str(tmp_path / name) for name in ("b.tsv", "a.tsv")], "dev": new["dev"]}
    for source, target in zip(swapped["train"], again["train"]):
        shutil.copy(source, target)
    assert records.prepare(out, dataset="files", files=again, vocab_size=500, train_shards=1)[
        "settings"]["vocab_size"] == 500
    assert os.stat(os.path.join(out, VOCAB)).st_mtime_ns != before  # learned again


def test_skipped_pairs_are_logged_once(small_corpus, tmp_path, caplog):
    # The train split is read once per vocabulary learned, then for the records: one count.
    with open(small_corpus["train"], encoding="utf-8") as f:
        lines = f.readlines()[:1000]
    (tmp_path / "train.tsv").write_text("".join(lines[:500]) + "\tno source\n"
                                        + "".join(lines[500:]), encoding="utf-8")
    with caplog.at_level("WARNING"):
        manifest = records.prepare(str(tmp_path / "prep"), dataset="files",
                                   files={"train": str(tmp_path / "train.tsv")}, vocab_size=500,
                                   separate=True)
    assert manifest["splits"]["train"]["examples"] == 1000
    assert caplog.text.count("skipped") == 1
    assert "files/train: skipped 1 pair with an empty side" in caplog.text
