"""Dev and test corpora given the other way round from the training corpus (side_order.py and
train.py's refusal), and input in the model's other language (translate.py and evaluate.py),
judged against numpy counts of adjacent characters."""
import collections
import json
import os
import shutil

import numpy as np
import pytest

from helpers import imported_modules, python
from tfnmt.data import side_order


def read_tsv(path, count=1000):
    with open(path, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")[:2]) for line in f][:count]


def write_tsv(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return str(path)


def mean_log_probabilities(train_pairs, pairs):
    """(as given, swapped): nats per character pair, add-one smoothed, counted with numpy."""
    def pairs_of(texts):
        return [f" {t.lower()} "[i:i + 2] for t in texts for i in range(len(t) + 1)]

    train_sides = [pairs_of(side) for side in zip(*train_pairs)]
    sides = [pairs_of(side) for side in zip(*pairs)]
    table = sorted(set().union(*train_sides, *sides))
    index = {pair: i for i, pair in enumerate(table)}

    def counts(seq):
        return np.bincount([index[p] for p in seq], minlength=len(table)).astype(np.float64)

    log_p = [np.log(counts(side) + 1) - np.log(len(side) + len(table)) for side in train_sides]
    source, target = (counts(side) for side in sides)

    def mean(c, log_probabilities):
        return float(c @ log_probabilities / c.sum())

    return ((mean(source, log_p[0]) + mean(target, log_p[1])) / 2,
            (mean(source, log_p[1]) + mean(target, log_p[0])) / 2)


def side_fits(train_pairs, texts):
    """{side: nats per character pair of `texts` under that training side}, add-one smoothed,
    counted with numpy."""
    def pairs_of(texts):
        return [f" {t.lower()} "[i:i + 2] for t in texts for i in range(len(t) + 1)]

    train_sides = [pairs_of(side) for side in zip(*train_pairs)]
    given = pairs_of(texts)
    table = sorted(set().union(*train_sides, given))
    index = {pair: i for i, pair in enumerate(table)}

    def counts(seq):
        return np.bincount([index[p] for p in seq], minlength=len(table)).astype(np.float64)

    c = counts(given)
    return {name: float(c @ (np.log(counts(side) + 1) - np.log(len(side) + len(table))) / c.sum())
            for name, side in zip(("source", "target"), train_sides)}


def test_text_in_the_other_language_is_told_apart(small_corpus, tmp_path):
    train, dev = read_tsv(small_corpus["train"]), read_tsv(small_corpus["dev"])
    path = str(tmp_path / side_order.PROFILE_FILE)
    side_order.write_profiles(path, train)
    profiles = side_order.read_profiles(path)
    german, english = [s for s, _ in dev], [t for _, t in dev]
    assert side_order.reads_like_other_side(profiles, german, "source") is None
    assert side_order.reads_like_other_side(profiles, english, "target") is None
    for texts, side in ((english, "source"), (german, "target")):
        fit = side_order.reads_like_other_side(profiles, texts, side)
        expected = side_fits(train, texts)
        assert fit == {name: pytest.approx(value, abs=1e-9) for name, value in expected.items()}
        other = "target" if side == "source" else "source"
        assert expected[other] - expected[side] > 2 * side_order.OTHER_LANGUAGE_MARGIN
    # Too little text to judge by, no profile, a damaged one: nothing said.
    assert side_order.reads_like_other_side(profiles, english[:1], "source") is None
    assert side_order.read_profiles(str(tmp_path / "missing.json")) is None
    with open(path, "r+b") as f:
        f.truncate(100)
    assert side_order.read_profiles(path) is None


def test_the_other_language_needs_the_margin_and_enough_text_on_every_side(small_corpus,
                                                                         tmp_path):
    train, dev = read_tsv(small_corpus["train"]), read_tsv(small_corpus["dev"])
    german, english = [s for s, _ in dev], [t for _, t in dev]
    side_order.write_profiles(str(tmp_path / "profiles.json"), train)
    profiles = side_order.read_profiles(str(tmp_path / "profiles.json"))
    # 60 English lines among 140 German ones fit the English side a little better, by less
    # than the margin: not called English.
    mixed = english[:60] + german[60:]
    fits = side_fits(train, mixed)
    assert 0 < fits["target"] - fits["source"] < side_order.OTHER_LANGUAGE_MARGIN
    assert side_order.reads_like_other_side(profiles, mixed, "source") is None
    assert side_order.reads_like_other_side(profiles, english, "source") is not None
    # A profile of fewer than MIN_CHARACTER_PAIRS pairs says too little to judge by.
    small = side_order.side_profiles(train[:1])
    assert min(sum(c.values()) for c in small.values()) < side_order.MIN_CHARACTER_PAIRS
    assert side_order.reads_like_other_side(small, english, "source") is None


def test_profiles_files(small_corpus, tmp_path, monkeypatch):
    train = read_tsv(small_corpus["train"], 20)
    path = tmp_path / side_order.PROFILE_FILE
    # Not JSON of two sides' counts: no profile (the check it serves is skipped).
    for text in ("[]", '{"source": [], "target": {}}', '{"source": {"ab": "x"}, "target": {}}',
                 '{"source": {}}'):
        path.write_text(text)
        assert side_order.read_profiles(str(path)) is None, text
    # A model_dir's profile, once written, is kept (a resumed run's data does not replace it).
    path.unlink()
    settings = {"data": {"dataset": "files", "files": {"train": small_corpus["train"]}}}
    assert side_order.keep_profiles(str(tmp_path), settings, sample=20) == str(path)
    written = path.read_bytes()
    assert json.loads(written) == {side: dict(counts) for side, counts in
                                   side_order.side_profiles(train).items()}
    assert side_order.keep_profiles(str(tmp_path), settings, sample=40) == str(path)
    assert path.read_bytes() == written
    # A write that fails (a full disk, reported when the file is flushed to it) leaves no file
    # behind, whole or half.
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        side_order.write_profiles(str(tmp_path / "other.json"), train)
    assert sorted(os.listdir(tmp_path)) == [side_order.PROFILE_FILE]


def test_translate_and_evaluate_say_input_in_the_other_language(small_corpus, tiny_model_dir,
                                                               tmp_path):
    # English given to a German->English model was translated without a word, and evaluate.py
    # with --source and --reference swapped scored it.
    from tfnmt.inference.loading import other_language

    # A model_dir without character_pairs.json (trained before train.py kept it): counted from
    # the training text its settings.json names.
    model_dir = str(tmp_path / "model")
    shutil.copytree(tiny_model_dir, model_dir)
    with open(os.path.join(model_dir, "settings.json")) as f:
        settings = json.load(f)
    settings["data"] = {"dataset": "files", "files": {"train": small_corpus["train"]}}
    with open(os.path.join(model_dir, "settings.json"), "w") as f:
        json.dump(settings, f)
    train, dev = read_tsv(small_corpus["train"]), read_tsv(small_corpus["dev"], 30)
    german, english = tmp_path / "dev.de", tmp_path / "dev.en"
    german.write_text("".join(s + "\n" for s, _ in dev), encoding="utf-8")
    english.write_text("".join(t + "\n" for _, t in dev), encoding="utf-8")
    fit = {side: f"{side_fits(train, [t for _, t in dev])[side]:.2f}"
           for side in ("source", "target")}
    said = (f"reads like the model's target language, not its source language (log-probability "
            f"per character pair under its training targets {fit['target']}, sources "
            f"{fit['source']})")
    result = python("translate.py", f"--model_dir={model_dir}", f"--input={english}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"translate.py: --input {english} {said}\n" in result.stderr
    assert len(result.stdout.splitlines()) == len(dev)  # translated all the same
    assert other_language(model_dir, None, [s for s, _ in dev], "x") is None  # German: silent
    result = python("evaluate.py", f"--model_dir={model_dir}", f"--source={english}",
                    f"--reference={german}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"evaluate.py: --source {english} {said}\n" in result.stderr
    assert f"evaluate.py: --reference {german} reads like the model's source language, not its " \
           "target language" in result.stderr
    # An export keeps the model's record in its assets.extra (TF Serving leaves it alone);
    # export.py writes it into the model_dir first (one search dtype, not `auto`'s two: less
    # to trace).
    assert not os.path.exists(os.path.join(model_dir, side_order.PROFILE_FILE))
    result = python("export.py", f"--model_dir={model_dir}", "--check=false",
                    "--matmul_dtype=float32")
    assert result.returncode == 0, result.stderr[-3000:]
    export_dir = os.path.join(model_dir, "export")
    version = os.path.join(export_dir, os.listdir(export_dir)[0])
    with open(os.path.join(model_dir, side_order.PROFILE_FILE), "rb") as f, \
            open(os.path.join(version, "assets.extra", side_order.PROFILE_FILE), "rb") as g:
        assert f.read() == g.read()
    expected = [collections.Counter(f" {t.lower()} "[i:i + 2] for t in side
                                    for i in range(len(t) + 1)) for side in zip(*train)]
    assert side_order.read_profiles(os.path.join(model_dir, side_order.PROFILE_FILE)) == {
        "source": expected[0], "target": expected[1]}
    assert other_language(None, export_dir, [t for _, t in dev], "x").startswith(f"x {said[:30]}")
    # A CTranslate2 model keeps it beside its files.
    result = python("export.py", f"--model_dir={model_dir}", "--check=false",
                    "--format=ctranslate2")
    assert result.returncode == 0, result.stderr[-3000:]
    ct2_dir = os.path.join(model_dir, "ctranslate2")
    assert side_order.read_profiles(os.path.join(ct2_dir, side_order.PROFILE_FILE)) == {
        "source": expected[0], "target": expected[1]}
    assert other_language(None, ct2_dir, [t for _, t in dev], "x").startswith(f"x {said[:30]}")
    assert other_language(None, ct2_dir, [s for s, _ in dev], "x") is None


def test_a_split_given_the_other_way_round_is_told_apart(small_corpus):
    train, dev = read_tsv(small_corpus["train"]), read_tsv(small_corpus["dev"])
    swapped = [(t, s) for s, t in dev]
    assert side_order.swapped_sides(train, dev) is None
    evidence = side_order.swapped_sides(train, swapped)
    as_given, other_way = mean_log_probabilities(train, swapped)
    assert evidence == {"as_given": pytest.approx(as_given, abs=1e-9),
                        "swapped": pytest.approx(other_way, abs=1e-9)}
    assert other_way - as_given > 3 * side_order.SWAPPED_MARGIN
    # One language on both sides, and samples too short to judge: not taken for swapped.
    english = [(t, t) for _, t in train]
    assert side_order.swapped_sides(english, [(t, t) for _, t in dev]) is None
    assert side_order.swapped_sides(train, swapped[:1]) is None
    assert side_order.swapped_sides(train, []) is None


def test_train_py_refuses_dev_and_test_files_given_the_other_way_round(small_corpus, tmp_path):
    # In one line before TensorFlow loads, naming the order to give (or, for a TSV, the columns
    # to swap); --reverse reads every split the other way round alike.
    dev = read_tsv(small_corpus["dev"])
    (tmp_path / "dev.de").write_text("".join(s + "\n" for s, _ in dev), encoding="utf-8")
    (tmp_path / "dev.en").write_text("".join(t + "\n" for _, t in dev), encoding="utf-8")
    de, en = tmp_path / "dev.de", tmp_path / "dev.en"
    swapped_tsv = write_tsv(tmp_path / "dev.en-de.tsv", [(t, s) for s, t in dev])
    explained = ("its pairs look given the other way round from the training pairs: their "
                 "sources read like the training targets and their targets like the training "
                 "sources (by how often each two adjacent characters occur in the first 1,000 "
                 "pairs of each): ")
    for flags, refusal in (
            ([f"--dev_files={en},{de}"], f"--dev_files={en},{de}: {explained}give "
             f"--dev_files={de},{en}"),
            ([f"--dev_files={swapped_tsv}"], f"--dev_files={swapped_tsv}: {explained}swap the "
             "columns of its TSV"),
            ([f"--dev_files={small_corpus['dev']}", f"--test_files={en},{de}", "--reverse"],
             f"--test_files={en},{de}: {explained}give --test_files={de},{en}")):
        model_dir = tmp_path / "run"
        result = python("train.py", f"--model_dir={model_dir}",
                        f"--train_files={small_corpus['train']}", *flags, timeout=60,
                        env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == f"train.py: {refusal}"
        assert "tensorflow" not in imported_modules(result.stderr)
        assert list(model_dir.iterdir()) == []


def test_pairs_whose_sources_are_their_targets_are_refused(small_corpus, tmp_path):
    # `--train_files=train.de,train.de` trained a model to copy, and a dev set whose sides are
    # one file scored copying, without a word. Refused from 95% of the first 1,000 pairs on; a
    # copied corpus beside a translated one passes.
    from absl import app

    from tfnmt.programs.train_data_checks import check_copied_sides

    train = read_tsv(small_corpus["train"])
    english = [t for _, t in train]
    for copies, refused in ((950, True), (949, False)):  # of 1,000
        pairs = [(t, t) for t in english[:copies]] + train[copies:1000]
        assert sum(s == t for s, t in pairs) == copies  # none of the translated pairs is a copy
        spec = write_tsv(tmp_path / f"train{copies}.tsv", pairs)
        settings = {"data": {"dataset": "files", "files": {"train": spec}}}
        if refused:
            with pytest.raises(app.UsageError, match=rf"--train_files={spec}: the pairs' sources "
                               r"are their targets \(950 of the first 1,000 pairs\)"):
                check_copied_sides(settings)
        else:
            check_copied_sides(settings)
    copied = write_tsv(tmp_path / "copied.tsv", [(t, t) for t in english])
    translated = small_corpus["train"]
    check_copied_sides({"data": {"dataset": "files", "files": {"train": [translated, copied]}}})
    with pytest.raises(app.UsageError, match="of each corpus"):
        check_copied_sides({"data": {"dataset": "files", "files": {"train": [copied, copied]}}})
    # train.py, in one line before TensorFlow loads, with nothing written.
    english_file = tmp_path / "train.en"
    english_file.write_text("".join(t + "\n" for t in english), encoding="utf-8")
    dev = read_tsv(small_corpus["dev"])
    dev_copied = write_tsv(tmp_path / "dev-copied.tsv", [(t, t) for _, t in dev])
    for flags, refusal in (
            ([f"--train_files={english_file},{english_file}",
              f"--dev_files={small_corpus['dev']}"],
             f"--train_files={english_file},{english_file}: the pairs' sources are their targets "
             f"(1,000 of the first 1,000 pairs): a model trained on them learns to copy: give "
             "the source and the target files (a copied corpus helps only beside translated "
             "ones)"),
            ([f"--train_files={translated}", f"--dev_files={dev_copied}"],
             f"--dev_files={dev_copied}: the pairs' sources are their targets ({len(dev):,d} of "
             f"the first {len(dev):,d} pairs): its scores would measure copying: give its source "
             "and target files")):
        model_dir = tmp_path / "run"
        result = python("train.py", f"--model_dir={model_dir}", *flags, timeout=60,
                        env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == f"train.py: {refusal}"
        assert "tensorflow" not in imported_modules(result.stderr)
        assert list(model_dir.iterdir()) == []


def test_a_side_that_holds_no_sentences_is_refused(small_corpus, tmp_path):
    # A TSV of id, source, target trained a model to translate ids into German without a word
    # (its first two columns are the pair). Refused from 95% of the first 1,000 lines on, with
    # the columns that hold the sentences where they show.
    from absl import app

    from tfnmt.programs.train_data_checks import check_text_sides

    train = read_tsv(small_corpus["train"])

    def settings(train_files, reverse=False):
        return {"data": {"dataset": "files", "files": {"train": train_files},
                         "reverse": reverse}}

    for numbers, refused in ((950, True), (949, False)):  # of 1,000
        rows = [f"{i}\t{t}" if i < numbers else f"{s}\t{t}" for i, (s, t) in enumerate(train)]
        path = tmp_path / f"train{numbers}.tsv"
        path.write_text("".join(row + "\n" for row in rows), encoding="utf-8")
        if refused:
            with pytest.raises(app.UsageError, match=(
                    rf"--train_files={path}: its column 1 \(the source side; a TSV's first two "
                    r"columns are the source and the target\) holds no sentences: 950 of the "
                    r"first 1,000 lines are numbers, ids or URLs: give its two sentence "
                    r"columns as two files \(cut -f<column>\)$")):
                check_text_sides(settings(str(path)))
        else:
            check_text_sides(settings(str(path)))
    ids = tmp_path / "ids.tsv"
    ids.write_text("".join(f"{i}\t{s}\t{t}\n" for i, (s, t) in enumerate(train)),
                   encoding="utf-8")
    with pytest.raises(app.UsageError, match=(
            r"holds no sentences: 1,000 of the first 1,000 lines are numbers, ids or URLs: its "
            rf"sentences look to be in columns 2 and 3: cut -f2 {ids} > {tmp_path}/ids.2; cut "
            rf"-f3 {ids} > {tmp_path}/ids.3; then --train_files={tmp_path}/ids.2,"
            rf"{tmp_path}/ids.3$")):
        check_text_sides(settings(str(ids)))
    # URLs, as the side of two files, and --reverse naming that side the source.
    (tmp_path / "urls.txt").write_text("".join(f"https://example.org/{i}?p=1\n"
                                               for i in range(len(train))))
    (tmp_path / "train.de").write_text("".join(s + "\n" for s, _ in train), encoding="utf-8")
    spec = f"{tmp_path}/train.de,{tmp_path}/urls.txt"
    for reverse, role in ((False, "target"), (True, "source")):
        with pytest.raises(app.UsageError, match=rf"--train_files={spec}: {tmp_path}/urls.txt "
                           rf"\(the {role} side\) holds no sentences: 1,000 of"):
            check_text_sides(settings(spec, reverse))
    # Scripts without Latin letters are sentences; so is a short dev set of numbers (too few
    # lines to judge by).
    (tmp_path / "zh.txt").write_text("".join("这是第%d句话。\n" % i for i in range(len(train))),
                                     encoding="utf-8")
    check_text_sides(settings(f"{tmp_path}/train.de,{tmp_path}/zh.txt"))
    (tmp_path / "dev.tsv").write_text("".join(f"{i}\t{i}\n" for i in range(9)))
    check_text_sides({"data": {"dataset": "files", "files": {
        "train": small_corpus["train"], "dev": str(tmp_path / "dev.tsv")}}})
    # train.py, in one line before TensorFlow loads, with nothing written.
    model_dir = tmp_path / "run"
    result = python("train.py", f"--model_dir={model_dir}", f"--train_files={ids}",
                    f"--dev_files={small_corpus['dev']}", timeout=60,
                    env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"train.py: --train_files={ids}: its column 1 (the source side;")
    assert "tensorflow" not in imported_modules(result.stderr)
    assert not model_dir.exists() or list(model_dir.iterdir()) == []
