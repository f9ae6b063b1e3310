"""Raw text readers, the corpus builder's cleaning/split rules, and the committed corpus."""
import gzip
import importlib.util
import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest
import tensorflow_datasets as tfds

from tfnmt import paths
from tfnmt.data import corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_builder():
    spec = importlib.util.spec_from_file_location(
        "build_corpus", os.path.join(ROOT, "data", "build_corpus.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_split(split):
    with gzip.open(os.path.join(paths.EMBEDDED_DIR, f"{split}.tsv.gz"), "rt") as f:
        return [line.rstrip("\n").split("\t") for line in f]


def test_committed_corpus_keeps_dev_and_test_out_of_training():
    train = read_split("train")
    held_out = read_split("dev") + read_split("test")
    assert len(read_split("test")) == 1136 and len(read_split("dev")) == 462
    train_sentences = {text for pair in train for text in pair[:2]}
    leaks = [pair for pair in held_out if pair[0] in train_sentences or pair[1] in train_sentences]
    assert not leaks, leaks[:3]
    assert all(len(p) == 3 and p[0] and p[1] for p in train)


def test_builder_cleans_and_splits(tmp_path):
    build_corpus = load_builder()
    db = tmp_path / "bible.db"
    connection = sqlite3.connect(db)
    connection.execute("CREATE TABLE bible (id, bbName, bNumber, cNumber, vNumber, vText)")
    verses = [  # (book, chapter, verse, German, English)
        (1, 1, 1, "(1:2) Am Anfang schuf Gott.", "In the beginning God`s [own]  word."),
        (1, 1, 2, "Ein Vers.", ""),  # empty side: dropped
        (8, 1, 1, "Ruth ging.", "Ruth went."),  # dev book
        (41, 1, 1, "Markus schrieb.", "Mark wrote."),  # test book
        (40, 1, 1, "Markus schrieb.", "Mark wrote."),  # same verse in a train book: removed
        (3, 2, 12, "Als Erstlinge.", "As first -[fruits] offering."),
    ]
    for i, (b, c, v, de, en) in enumerate(verses):
        connection.execute("INSERT INTO bible VALUES (?,?,?,?,?,?)", (2 * i, "s", b, c, v, de))
        connection.execute("INSERT INTO bible VALUES (?,?,?,?,?,?)", (2 * i + 1, "4", b, c, v, en))
    connection.commit()
    ding = tmp_path / "de-en"
    lines = ["# comment"]
    for i in range(52):
        lines.append(f"Satz {{m}} | Das ist Satz Nummer {i}. :: sentence | This is sentence "
                     f"number {i}.")
    lines.append("Er ist da [Br.]. | Sie kommt heute nicht. :: He is there. | She is not coming.")
    ding.write_text("\n".join(lines) + "\n", encoding="utf-8")

    splits = build_corpus.build(str(db), str(ding), str(tmp_path / "out"))
    train_bible = [p[:2] for p in splits["train"] if p[2] == "bible"]
    assert train_bible == [("Am Anfang schuf Gott.", "In the beginning God's own word."),
                           ("Als Erstlinge.", "As first-fruits offering.")]
    assert [p[:2] for p in splits["dev"] if p[2] == "bible"] == [("Ruth ging.", "Ruth went.")]
    assert [p[:2] for p in splits["test"] if p[2] == "bible"] == [("Markus schrieb.",
                                                                   "Mark wrote.")]
    ding_test = [p[0] for p in splits["test"] if p[2] == "ding"]
    ding_dev = [p[0] for p in splits["dev"] if p[2] == "ding"]
    assert ding_test == ["Das ist Satz Nummer 0.", "Das ist Satz Nummer 50."]
    assert ding_dev == ["Das ist Satz Nummer 1.", "Das ist Satz Nummer 51."]
    # Sub-entry with a tag on one side dropped; its untagged neighbour kept.
    ding_train = [p[0] for p in splits["train"] if p[2] == "ding"]
    assert "Sie kommt heute nicht." in ding_train and len(ding_train) == 49
    with gzip.open(tmp_path / "out" / "dev.tsv.gz", "rt") as f:
        assert f.readline() == "Ruth ging.\tRuth went.\tbible\n"


def test_local_files_bad_input_names_file_and_line(tmp_path):
    good = tmp_path / "a.de"
    good.write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    short = tmp_path / "a.en"
    short.write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(corpus.CorpusError, match=r"a.en: ends at line 2.*not line-aligned"):
        list(corpus.read_files([str(good), str(short)]))
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"gut\tgood\nschlecht\tbad \xff\n")
    with pytest.raises(corpus.CorpusError, match=r"bad.tsv:2: invalid UTF-8"):
        list(corpus.read_files(str(bad)))
    tabless = tmp_path / "tabless.tsv"
    tabless.write_text("gut\tgood\nno tab here\n", encoding="utf-8")
    with pytest.raises(corpus.CorpusError, match=r"tabless.tsv:2: expected 2"):
        list(corpus.read_files(str(tabless)))
    with pytest.raises(corpus.CorpusError, match="missing.tsv: file not found"):
        list(corpus.read_files(str(tmp_path / "missing.tsv")))


def test_a_byte_order_mark_is_not_text(tmp_path):
    # Windows editors start UTF-8 files with EF BB BF; only there is it dropped (U+FEFF inside
    # a line is text), and a later error's byte position still counts it.
    tsv = tmp_path / "bom.tsv"
    tsv.write_bytes(b"\xef\xbb\xbfgut\tgood\r\nja\xef\xbb\xbfwohl\tyes\n")
    assert list(corpus.read_files(str(tsv))) == [("gut", "good"), ("ja\ufeffwohl", "yes")]
    source, target = tmp_path / "a.de", tmp_path / "a.en"
    source.write_bytes(b"\xef\xbb\xbfeins\nzwei\n")
    target.write_bytes(b"one\ntwo\n")
    assert list(corpus.read_files([str(source), str(target)])) == [("eins", "one"),
                                                                    ("zwei", "two")]
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"\xef\xbb\xbfab\xff\tx\n")
    with pytest.raises(corpus.CorpusError, match=r"bad.tsv:1: invalid UTF-8 \(invalid start "
                                                 r"byte at byte 5\)"):
        list(corpus.read_files(str(bad)))


def test_a_utf16_corpus_is_named_as_such(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_bytes("gut\tgood\nja\tyes\n".encode("utf-16"))
    with pytest.raises(corpus.CorpusError, match=re.escape(
            f"{tsv}: UTF-16 text, not UTF-8 (`iconv -f UTF-16 -t UTF-8 {tsv} > "
            f"{tmp_path}/train.utf8.tsv` converts it)")):
        list(corpus.read_files(str(tsv)))
    source, target = tmp_path / "a.de", tmp_path / "a.en"
    source.write_bytes("eins\nzwei\n".encode("utf-8"))
    target.write_bytes("one\ntwo\n".encode("utf-16-le"))  # no byte order mark
    for read in (lambda: list(corpus.read_files([str(source), str(target)])),
                 lambda: corpus.check_files(f"{source},{target}")):  # 2 lines against 3
        with pytest.raises(corpus.CorpusError, match=re.escape(f"{target}: UTF-16LE text")):
            read()


def test_a_pipe_is_refused_as_a_corpus_not_read_as_empty(tmp_path):
    # `--train_files=<(paste a.de a.en)`: the check read the pipe, and the vocabulary was then
    # learned from nothing ("the train split is empty").
    read, write = os.pipe()
    os.write(write, b"gut\tgood\n")
    os.close(write)
    try:
        with pytest.raises(corpus.CorpusError, match=re.escape(
                f"/dev/fd/{read} is a pipe or a device (a shell's <(...)?), which can be read "
                "once")):
            corpus.check_files(f"/dev/fd/{read}")
        assert os.read(read, 100) == b"gut\tgood\n"  # left unread
    finally:
        os.close(read)


def test_a_truncated_gzip_file_is_named_with_its_last_good_line(tmp_path):
    # A .gz cut short (an interrupted download or copy) gzips fine up to where it ends: the
    # pairs before that are read, then one CorpusError names the file and the last full line,
    # whether it is a TSV, one of two aligned files, or checked before any work.
    lines = [f"Satz {n}\tsentence {n} {'x' * (n % 7)}\n" for n in range(5000)]
    data = gzip.compress("".join(lines).encode())
    cut = tmp_path / "cut.tsv.gz"
    cut.write_bytes(data[:len(data) // 2])
    with gzip.open(cut, "rb") as f:  # what Python's gzip reads before the end-of-stream error
        good = []
        with pytest.raises(EOFError):
            for raw in f:
                good.append(raw)
    complete = len([raw for raw in good if raw.endswith(b"\n")])
    assert 0 < complete < 5000
    read = []
    with pytest.raises(corpus.CorpusError, match=(
            rf"cut.tsv.gz: unreadable after line {len(good):,d} \(Compressed file ended "
            r"before the end-of-stream marker was reached\)")):
        for pair in corpus.read_files(str(cut)):
            read.append(pair)
    assert read[:complete] == [tuple(line.rstrip("\n").split("\t")) for line in
                               lines[:complete]]
    whole = tmp_path / "whole.en.gz"
    whole.write_bytes(gzip.compress("".join(f"s{n}\n" for n in range(5000)).encode()))
    with pytest.raises(corpus.CorpusError, match=r"cut.tsv.gz: unreadable after line"):
        list(corpus.read_files([str(cut), str(whole)]))
    with pytest.raises(corpus.CorpusError, match=r"cut.tsv.gz: unreadable \(Compressed file"):
        corpus.check_files(f"{cut},{whole}")


def test_empty_sides_are_skipped_and_counted(tmp_path, caplog):
    path = tmp_path / "train.tsv"
    path.write_text("gut\tgood\n\tnothing\nnichts\t \nja\tyes\n", encoding="utf-8")
    pairs = list(corpus.read_corpus("files", "train", str(path)))
    assert pairs == [("gut", "good"), ("ja", "yes")]
    assert "skipped 2 pairs" in caplog.text
    # A run reads its dev split at each evaluation: the count is logged once per process.
    caplog.clear()
    assert list(corpus.read_corpus("files", "train", str(path))) == pairs
    assert list(corpus.read_corpus("files", "dev", str(path))) == pairs
    assert list(corpus.read_corpus("files", "dev", str(path))) == pairs
    assert caplog.text.count("skipped") == 1 and "files/dev: skipped 2 pairs" in caplog.text
    caplog.clear()  # a second pass over the text says nothing
    assert list(corpus.read_corpus("files", "test", str(path), log_skipped=False)) == pairs
    assert "skipped" not in caplog.text


def test_lines_with_more_columns_than_the_first_are_counted(tmp_path, caplog):
    path = tmp_path / "train.tsv"
    path.write_text("gut\tgood\nja\tyes\nein\tTab\tgetrennt\tand more\n"
                    "nein\tno\nzwei\tTabs\there\n", encoding="utf-8")
    expected = [("gut", "good"), ("ja", "yes"), ("ein", "Tab"), ("nein", "no"),
                ("zwei", "Tabs")]
    assert list(corpus.read_files(str(path))) == expected
    assert caplog.text.count("more tab-separated columns") == 1
    assert f"{path}: 2 lines have more tab-separated columns than line 1 (2), the first at " \
        "line 3" in caplog.text
    caplog.clear()  # read again (each evaluation, the second pass): said once per process
    assert list(corpus.read_files(str(path))) == expected
    assert "columns" not in caplog.text
    # A third column on every line (an id, a domain) is a format, not a fault.
    same = tmp_path / "tagged.tsv"
    same.write_text("gut\tgood\tbible\nja\tyes\tnews\n", encoding="utf-8")
    assert list(corpus.read_files(str(same))) == [("gut", "good"), ("ja", "yes")]
    assert "columns" not in caplog.text
    one = tmp_path / "one.tsv"
    one.write_text("gut\tgood\nja\tyes\tmore\n", encoding="utf-8")
    assert list(corpus.read_files(str(one))) == [("gut", "good"), ("ja", "yes")]
    assert f"{one}: 1 line has more tab-separated columns than line 1 (2), the first at line 2" \
        in caplog.text


def test_reverse_makes_the_second_side_the_source(tmp_path):
    tsv = tmp_path / "dev.tsv"
    tsv.write_text("gut\tgood\n\tnothing\nja\tyes\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "test.en").write_text("one\ntwo\n", encoding="utf-8")
    assert list(corpus.read_corpus("files", "dev", str(tsv), reverse=True)) == [
        ("good", "gut"), ("yes", "ja")]
    # A run's data settings, as evaluate.py and the end of a run read their splits.
    data = {"dataset": "files", "reverse": True,
            "files": {"dev": str(tsv), "test": f"{tmp_path / 'test.de'},{tmp_path / 'test.en'}"}}
    assert list(corpus.read_split(data, "test")) == [("one", "eins"), ("two", "zwei")]
    assert list(corpus.read_split(dict(data, reverse=False), "dev")) == [("gut", "good"),
                                                                        ("ja", "yes")]
    assert list(corpus.read_split({"dataset": "files", "files": data["files"]}, "dev"))[0] == \
        ("gut", "good")  # settings saved before --reverse existed


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(corpus.CorpusError, match="unknown dataset 'no_such_dataset'"):
        list(corpus.read_corpus("no_such_dataset", "train"))


def test_offline_download_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "network_available", lambda: False)
    start = time.time()
    with pytest.raises(corpus.CorpusError, match="cannot reach the internet"):
        list(corpus.read_corpus("wmt14_translate/de-en", "train", tfds_data_dir=str(tmp_path)))
    assert time.time() - start < 10  # no minutes of download retries


def test_tfds_translation_dataset_with_mock_data(monkeypatch):
    # mock_data replaces the download and the records; the network probe is ours to stub.
    monkeypatch.setattr(corpus, "network_available", lambda: True)
    with tfds.testing.mock_data(num_examples=7):
        pairs = list(corpus.read_corpus("ted_hrlr_translate/pt_to_en", "dev"))
    assert len(pairs) == 7 and all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)


def test_embedded_corpus_is_read_from_its_files_as_its_tfds_builder_reads_it(tmp_path,
                                                                            monkeypatch):
    # tfnmt reads the files, without TensorFlow; the local TFDS builder (`tfds.load`) gives the
    # same pairs, read in batches of 100 (a last, partial one included): every pair of the
    # file, in order.
    monkeypatch.setattr(corpus, "TFDS_READ_BATCH", 100)
    for split, count in (("train", 46930), ("dev", 462), ("test", 1136)):
        pairs = list(corpus.read_corpus("embedded", split))
        assert len(pairs) == count
        assert pairs == [(s.strip(), t.strip()) for s, t, *_ in read_split(split)]
        assert pairs == [(s.strip(), t.strip()) for s, t in
                         corpus.read_tfds(corpus.EMBEDDED_TFDS_NAME, split, str(tmp_path))]
    code = ("import sys; from tfnmt.data import corpus; "
            "print(sum(1 for _ in corpus.read_corpus('embedded', 'test')), "
            "'tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "1136 False\n", result.stderr[-3000:]


def test_corpus_paths_that_cannot_be_meant_as_given_say_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.de").write_text("Das ist ein Haus.\nJa.\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("This is a house.\nYes.\n", encoding="utf-8")
    corpus.check_files("train.de,train.en")  # as meant
    with pytest.raises(corpus.CorpusError, match=r"^' train.en': file not found \(a blank "
                       r"around the name: 'train.en' exists\)$"):
        corpus.check_files("train.de, train.en")
    with pytest.raises(corpus.CorpusError, match=r"^'train.\*': file not found \(wildcards are "
                       r"not expanded: name each corpus, repeating the flag\)$"):
        corpus.check_files("train.*")
    with pytest.raises(corpus.CorpusError, match=r"^other.en: file not found$"):
        corpus.check_files("train.de,other.en")
    with pytest.raises(corpus.CorpusError, match=r"^' other.en': file not found \(a blank "
                       r"around the name\)$"):
        corpus.check_files("train.de, other.en")  # no file by the name without it either
    # One file is a TSV: one side's file alone is refused at once, not at its first line read.
    with pytest.raises(corpus.CorpusError, match=r"^train.de: its first line holds no tab, and "
                       r"one file is read as a TSV \(source<TAB>target\): for a file per side "
                       r"give both, source first \(train.de,<the target side's file>\)$"):
        corpus.check_files("train.de")
    (tmp_path / "pairs.tsv").write_text("Ja.\tYes.\nohne Tab\n", encoding="utf-8")
    corpus.check_files("pairs.tsv")  # a later line without a tab is named when read


def test_aligned_files_are_counted_by_their_lines_not_their_newlines(tmp_path):
    # A last line without a newline (as many editors save) is a line: the two files below
    # hold two pairs each, and one more line in one of them is counted as such.
    source, target = tmp_path / "a.de", tmp_path / "a.en"
    source.write_text("eins\nzwei", encoding="utf-8")
    target.write_text("one\ntwo\n", encoding="utf-8")
    corpus.check_files(f"{source},{target}")
    assert list(corpus.read_files([str(source), str(target)])) == [("eins", "one"),
                                                                    ("zwei", "two")]
    target.write_text("one\ntwo\nthree", encoding="utf-8")
    with pytest.raises(corpus.CorpusError, match=r"a.de has 2 lines but \S+a.en has 3: the "
                                                 r"files are not line-aligned"):
        corpus.check_files(f"{source},{target}")


def test_the_input_fingerprint_holds_each_files_checksum(tmp_path):
    # Two aligned files and a TSV, as the files of a run's splits: each file's own sha256
    # (hashlib over its bytes), so that a change to either side of a pair makes prepared data
    # rebuild; a file not there yet has none.
    import hashlib

    paths = {name: tmp_path / name for name in ("a.de", "a.en", "b.tsv")}
    for name, path in paths.items():
        path.write_text(f"{name}\n", encoding="utf-8")
    files = {"train": [f"{paths['a.de']},{paths['a.en']}", str(paths["b.tsv"])],
             "dev": str(tmp_path / "missing.tsv")}
    assert corpus.input_fingerprint("files", files) == {"files": {
        "dev": {str(tmp_path / "missing.tsv"): None},
        "train": {str(path): hashlib.sha256(path.read_bytes()).hexdigest()
                  for path in paths.values()}}}
