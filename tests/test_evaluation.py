import json

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from tfnmt.data import records
from tfnmt.data.pipeline import make_dataset
from tfnmt.data.special_tokens import EOS_ID
from tfnmt.inference.evaluation import evaluate_loss
from tfnmt.inference.sacrebleu_scores import corpus_scores
from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer


def test_corpus_scores_are_sacrebleus():
    hypotheses = ["The house is red.", "Good morning!", "He spoke to them."]
    references = ["The house is red.", "Good morning, all!", "He said to them."]
    scores = corpus_scores(hypotheses, references)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert 0 < scores["bleu"] < 100
    full = corpus_scores(hypotheses, references, ter=True, signatures=True)
    assert full["ter"] == sacrebleu.corpus_ter(hypotheses, [references]).score
    assert full["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert "nc:6|nw:0" in full["chrf_signature"] and "tok:tercom" in full["ter_signature"]
    assert corpus_scores(references, references)["bleu"] == pytest.approx(100)
    # Several references per sentence: sacreBLEU's multi-reference scores.
    second = ["The house is red.", "Good morning!", "He told them."]
    both = corpus_scores(hypotheses, references, ter=True, signatures=True,
                         more_references=[second])
    assert both["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references, second]).score
    assert both["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references, second]).score
    assert both["ter"] == sacrebleu.corpus_ter(hypotheses, [references, second]).score
    assert both["bleu"] > scores["bleu"] and both["bleu_signature"].startswith("nrefs:2|")


@pytest.mark.parametrize("hypotheses,references,message", [
    (["a b c", "d e f", "g h i"], ["a b c", "d e f"], "3 hypotheses for 2 references"),
    (["a b c"], ["a b c", "d e f"], "1 hypotheses for 2 references"),
    ([], [], "no sentences"),
    (["a b c", "d e f"], ["a b c", "d e f", "g"], "2 hypotheses for 3 references"),
])
def test_corpus_scores_refuse_what_cannot_be_scored(hypotheses, references, message):
    with pytest.raises(ValueError, match=message):
        corpus_scores(hypotheses, references)
    with pytest.raises(ValueError, match=message):  # as a second reference
        corpus_scores(hypotheses, hypotheses, more_references=[references])


def test_scores_of_standard_input_or_a_pipe_are_named_by_their_flag(tmp_path):
    # `--hypotheses=-`, and `--hypotheses=<(zcat news.hyp.gz)` (a pipe at /dev/fd/63), are
    # printed as what the flag read, not as "-" or "63"; a file by its name.
    import os
    import subprocess
    import sys

    from helpers import ROOT

    (tmp_path / "ref.en").write_text("A house.\nGood morning!\n")
    hypotheses = "A house.\nGood day!\n"
    command = [sys.executable, os.path.join(ROOT, "evaluate.py"), f"--reference={tmp_path}/ref.en"]
    stdin = subprocess.run(command + ["--hypotheses=-"], input=hypotheses, capture_output=True,
                           text=True, timeout=60)
    assert stdin.returncode == 0, stdin.stderr
    assert stdin.stdout.splitlines()[0] == "--hypotheses (standard input): 2 sentences"
    read, write = os.pipe()
    os.write(write, hypotheses.encode())
    os.close(write)
    try:
        piped = subprocess.run(command + [f"--hypotheses=/dev/fd/{read}", "--json"],
                               pass_fds=(read,), capture_output=True, text=True, timeout=60)
    finally:
        os.close(read)
    assert piped.returncode == 0, piped.stderr
    scores = json.loads(piped.stdout)
    assert scores["scored"] == f"--hypotheses (/dev/fd/{read})" and scores["sentences"] == 2
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses.splitlines(),
                                                   [["A house.", "Good morning!"]]).score
    (tmp_path / "hyp.en").write_text(hypotheses)
    named = subprocess.run(command + [f"--hypotheses={tmp_path}/hyp.en"], capture_output=True,
                           text=True, timeout=60)
    assert named.stdout.splitlines()[0] == "hyp.en: 2 sentences"


def test_evaluate_py_scores_user_files_and_existing_translations(tiny_model_dir, tmp_path):
    import json

    from helpers import imported_modules, python

    sources = ["Das ist ein Haus.", "Guten Morgen!", "Er sprach zu ihnen."]
    references = ["That is a house.", "Good morning!", "He spoke to them."]
    second = ["This is a house.", "Morning!", "He talked to them."]
    (tmp_path / "src.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text("\n".join(references) + "\n", encoding="utf-8")
    (tmp_path / "ref-b.en").write_text("\n".join(second) + "\n", encoding="utf-8")
    baseline = ["That is a house.", "Good evening!", "He spoke."]
    (tmp_path / "base.en").write_text("\n".join(baseline) + "\n", encoding="utf-8")
    output = tmp_path / "hyp.en"
    # Writing the translations over a file it reads is refused before any work.
    over = python("evaluate.py", f"--model_dir={tiny_model_dir}",
                  f"--source={tmp_path / 'src.de'}", f"--reference={tmp_path / 'ref.en'}",
                  f"--baseline={tmp_path / 'base.en'}", f"--output={tmp_path / 'base.en'}")
    assert over.returncode == 1 and over.stderr.strip() == (
        f"evaluate.py: --output {tmp_path / 'base.en'}: is the --baseline file, which writing "
        "the output would overwrite")
    # Two references per sentence (--reference repeated), against a baseline's translations.
    translated = python("evaluate.py", f"--model_dir={tiny_model_dir}",
                        f"--source={tmp_path / 'src.de'}", f"--reference={tmp_path / 'ref.en'}",
                        f"--reference={tmp_path / 'ref-b.en'}", f"--output={output}", "--json",
                        f"--baseline={tmp_path / 'base.en'}")
    assert translated.returncode == 0, translated.stderr[-2000:]
    scores = json.loads(translated.stdout.strip().splitlines()[-1])
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 3 and (scores["sentences"], scores["references"]) == (3, 2)
    for name, score in (("bleu", sacrebleu.corpus_bleu), ("chrf", sacrebleu.corpus_chrf),
                        ("ter", sacrebleu.corpus_ter)):
        assert scores[name] == score(hypotheses, [references, second]).score
        test = scores["baseline"][name]
        assert test["baseline"] == pytest.approx(score(baseline, [references, second]).score)
        assert test["difference"] == pytest.approx(scores[name] - test["baseline"])
        assert 0 < test["p"] <= 1 and test["interval"][0] <= test["interval"][1]
    assert scores["bleu_signature"].startswith("nrefs:2|")

    # Translations made elsewhere: scored without a model, with the signatures printed. Lines
    # end at \n (or \r\n) only, as translate.py writes them, so a U+2028 or a form feed inside
    # a line keeps the files aligned; a byte order mark is not text.
    elsewhere = ["That is\u2028a house.", "Good\x0cday!", "He said it."]
    their_references = ["That is a house.", "Good morning!", "He\u2028spoke to them."]
    (tmp_path / "hyp2.en").write_bytes(("\ufeff" + "\r\n".join(elsewhere) + "\n").encode())
    (tmp_path / "ref2.en").write_bytes(("\n".join(their_references) + "\n").encode())
    # Scoring files needs no TensorFlow (seconds saved); the system's scores come from the
    # comparison's per-sentence statistics.
    scored = python("evaluate.py", f"--hypotheses={tmp_path / 'hyp2.en'}",
                    f"--reference={tmp_path / 'ref2.en'}", f"--baseline={tmp_path / 'base.en'}",
                    env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert "tensorflow" not in imported_modules(scored.stderr)
    expected = sacrebleu.corpus_bleu(elsewhere, [their_references])
    assert f"BLEU   {expected.score:6.2f}  nrefs:1|case:mixed|eff:no|tok:13a" in scored.stdout
    assert "chrF2" in scored.stdout and "TER" in scored.stdout
    # The baseline's scores, each difference and its test, after the scores.
    lines = scored.stdout.splitlines()
    assert lines[4].startswith(f"against --baseline {tmp_path / 'base.en'}: its score, the "
                               "difference (95% interval by paired bootstrap")
    theirs = sacrebleu.corpus_bleu(baseline, [their_references]).score
    assert lines[5].startswith(f"  BLEU   {theirs:6.2f}  {expected.score - theirs:+6.2f} [")
    assert lines[7].startswith("  TER ") and lines[7].endswith(" (lower is better)")

    (tmp_path / "short.en").write_text("one line\n")
    misaligned = python("evaluate.py", f"--hypotheses={tmp_path / 'hyp.en'}",
                        f"--reference={tmp_path / 'ref.en'}", f"--baseline={tmp_path / 'short.en'}")
    assert misaligned.returncode == 1
    assert misaligned.stderr.strip() == ("evaluate.py: --baseline and --reference have 1 and 3 "
                                         "lines: they must be line-aligned")
    misaligned = python("evaluate.py", f"--hypotheses={tmp_path / 'short.en'}",
                        f"--reference={tmp_path / 'ref.en'}")
    assert misaligned.returncode == 1
    assert misaligned.stderr.strip() == ("evaluate.py: --hypotheses and --reference have 1 and "
                                         "3 lines: they must be line-aligned")
    misaligned = python("evaluate.py", f"--hypotheses={tmp_path / 'hyp.en'}",
                        f"--reference={tmp_path / 'ref.en'}",
                        f"--reference={tmp_path / 'short.en'}")
    assert misaligned.returncode == 1
    assert misaligned.stderr.strip() == (f"evaluate.py: --hypotheses and --reference="
                                         f"{tmp_path / 'short.en'} have 3 and 1 lines: they must "
                                         "be line-aligned")


@pytest.mark.parametrize("given, flag, message", [
    ("--hypotheses", "--beam_size=8", "--beam_size is for translating, and --hypotheses scores "
     "translations made elsewhere: drop --beam_size"),
    ("--hypotheses", "--export=runs/de-en/export", "--export is for translating"),
    ("--hypotheses", "--checkpoint=best", "--checkpoint is for translating"),
    ("--hypotheses", "--model_dir=runs/de-en", "--hypotheses is scored against --reference, or "
     "without it against the --split of --model_dir: drop one of --reference and --model_dir"),
    ("--hypotheses", "--split=dev", "--split scores the model's dataset, and --reference gives "
     "your own sentences: drop --split"),
    ("--source", "--split=dev", "--split scores the model's dataset, and --reference gives "
     "your own sentences: drop --split"),
    ("--source", "--model_dir=runs/x --export=runs/x/export", "give one of --model_dir and "
     "--export to translate --source"),
])
def test_evaluate_py_refuses_flags_that_scoring_given_translations_would_leave_unused(
        given, flag, message, tmp_path):
    from helpers import python

    (tmp_path / "hyp.en").write_text("A house.\n")
    result = python("evaluate.py", f"{given}={tmp_path / 'hyp.en'}",
                    f"--reference={tmp_path / 'hyp.en'}", *flag.split(), timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"evaluate.py: {message}")


def test_evaluate_py_without_a_model_dir_says_what_to_give(tmp_path):
    from helpers import imported_modules, python

    def refusal(*flags):
        """The one-line error of evaluate.py run with flags, given before TensorFlow loads."""
        result = python("evaluate.py", *flags, env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=60)
        assert result.returncode == 1
        imported = imported_modules(result.stderr)
        assert "absl.app" in imported and "tensorflow" not in imported
        return result.stderr.strip().splitlines()[-1]

    # Scoring a split needs the model_dir's settings.json (which names the split's dataset).
    # An export given as --model_dir is named as one.
    (tmp_path / "export" / "1").mkdir(parents=True)
    (tmp_path / "export" / "1" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    for model_dir, advice in (
            (tmp_path / "export", "it is a SavedModel export: give it as --export, with "
                                  "--source and --reference"),
            (tmp_path / "export" / "1", "it is a SavedModel export: give it as --export, with "
                                        "--source and --reference"),
            (tmp_path / "empty", "give --model_dir, or --source and --reference")):
        assert refusal(f"--model_dir={model_dir}") == (
            f"evaluate.py: {model_dir} holds no trained model (no settings.json); {advice}")
    # A run on its own files without --test_files: no test split to score (the message names
    # evaluate.py's flags, not train.py's).
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "settings.json").write_text(json.dumps(
        {"data": {"dataset": "files", "files": {"train": "a.tsv", "dev": "b.tsv"}}}))
    assert refusal(f"--model_dir={trained}") == (
        f"evaluate.py: {trained} was trained on its own files with no test split (train.py "
        "--test_files): give --source and --reference")
    # An export with a split but no training directory: which directory is meant.
    assert refusal(f"--model_dir={tmp_path / 'empty'}",
                   f"--export={tmp_path / 'export'}", "--split=dev") == (
        f"evaluate.py: {tmp_path / 'empty'} holds no trained model (no settings.json); --export "
        "scores the --split of the data its training directory names: give that directory as "
        "--model_dir, or give --source and --reference")
    # Without --model_dir, the split is the data of the training directory the export lies in
    # (export.py's <model_dir>/export/<version>), not of the default runs/de-en.
    (trained / "export" / "3").mkdir(parents=True)
    (trained / "export" / "3" / "saved_model.pb").write_bytes(b"")
    for export in (trained / "export", trained / "export" / "3"):
        assert refusal(f"--export={export}") == (
            f"evaluate.py: {trained} was trained on its own files with no test split (train.py "
            "--test_files): give --source and --reference")
    assert refusal(f"--export={tmp_path / 'export'}") == (
        f"evaluate.py: --export={tmp_path / 'export'} lies in no training directory, whose "
        "settings.json names the data of --split: give that directory as --model_dir, or give "
        "--source and --reference")


def test_evaluate_py_scores_translations_made_elsewhere_against_a_split(tmp_path):
    # --hypotheses without --reference: the references are the --split's targets of the data
    # --model_dir's settings name (the second side, or with --reverse the first), and BLEU
    # tokenizes as that run chose; no TensorFlow is loaded.
    from helpers import imported_modules, python

    pairs = {"test": [("Das ist ein Haus.", "That is a house."),
                      ("Guten Morgen!", "Good morning!"),
                      ("Er sprach zu ihnen.", "He spoke to them."),
                      ("Wir gehen heute nach Hause.", "We are going home today.")],
             "dev": [("Ein roter Hund.", "A red dog."), ("Danke schön.", "Thank you.")]}
    files = {}
    for split, rows in pairs.items():
        files[split] = str(tmp_path / f"{split}.tsv")
        (tmp_path / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in rows))
    for reverse in (False, True):
        model_dir = tmp_path / f"run-{reverse}"
        model_dir.mkdir()
        (model_dir / "settings.json").write_text(json.dumps(
            {"data": {"dataset": "files", "files": files, "reverse": reverse},
             "train": {"bleu_tokenize": "intl"}}))
        references = [pair[0 if reverse else 1] for pair in pairs["test"]]
        hypotheses = ["It is a house.", "Good morning!", "He spoke.", "We go home today."]
        baseline = ["A house.", "Morning!", "He spoke to them.", "Today we go."]
        (tmp_path / "hyp").write_text("\n".join(hypotheses) + "\n")
        (tmp_path / "base").write_text("\n".join(baseline) + "\n")
        scored = python("evaluate.py", f"--hypotheses={tmp_path / 'hyp'}",
                        f"--model_dir={model_dir}", f"--baseline={tmp_path / 'base'}", "--json",
                        env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=60)
        assert scored.returncode == 0, scored.stderr[-2000:]
        assert "tensorflow" not in imported_modules(scored.stderr)
        scores = json.loads(scored.stdout)
        assert scores["scored"] == f"hyp, against the test split of {model_dir}"
        assert (scores["sentences"], scores["references"]) == (4, 1)
        for name, score in (("bleu", sacrebleu.corpus_bleu), ("chrf", sacrebleu.corpus_chrf),
                            ("ter", sacrebleu.corpus_ter)):
            options = {"tokenize": "intl"} if name == "bleu" else {}
            assert scores[name] == pytest.approx(score(hypotheses, [references], **options).score)
            assert scores["baseline"][name]["baseline"] == pytest.approx(
                score(baseline, [references], **options).score)
        assert "|tok:intl|" in scores["bleu_signature"]
    # Another split (of the reversed run's data); a count that differs from the split's is
    # refused.
    (tmp_path / "dev.hyp").write_text("A red dog.\nThanks.\n")
    dev = python("evaluate.py", f"--hypotheses={tmp_path / 'dev.hyp'}", f"--model_dir={model_dir}",
                 "--split=dev", "--bleu_tokenize=13a", timeout=60)
    assert dev.returncode == 0, dev.stderr[-2000:]
    assert dev.stdout.splitlines()[0] == (f"dev.hyp, against the dev split of {model_dir}: "
                                          "2 sentences")
    expected = sacrebleu.corpus_bleu(["A red dog.", "Thanks."],
                                     [["Ein roter Hund.", "Danke schön."]])  # reversed
    assert f"BLEU   {expected.score:6.2f}  nrefs:1|case:mixed|eff:no|tok:13a" in dev.stdout
    short = python("evaluate.py", f"--hypotheses={tmp_path / 'dev.hyp'}",
                   f"--model_dir={model_dir}", timeout=60)
    assert short.returncode == 1
    assert short.stderr.strip() == ("evaluate.py: --hypotheses and --split=test have 2 and 4 "
                                    "lines: they must be line-aligned")
    (tmp_path / "empty").mkdir()
    nothing = python("evaluate.py", f"--hypotheses={tmp_path / 'dev.hyp'}",
                     f"--model_dir={tmp_path / 'empty'}", timeout=60)
    assert nothing.returncode == 1
    assert nothing.stderr.strip() == (f"evaluate.py: {tmp_path / 'empty'} holds no trained model "
                                      "(no settings.json); give --model_dir, or --reference")


def test_report_samples_are_readable_and_spread():
    from tfnmt.training.report import pick_samples

    pairs = [(" ".join(["w"] * n), "t") for n in (2, 8, 30, 9, 7, 3, 12, 10, 1)]
    picked = pick_samples(pairs)
    assert len(picked) == 3 and picked == sorted(set(picked))
    assert all(6 <= len(pairs[i][0].split()) <= 20 for i in picked)
    assert pick_samples(pairs[:2]) == [0, 1] and pick_samples([]) == []


@pytest.mark.parametrize("translations, references, told", [
    (288, 36, True),  # the main job's test split
    (60, 36, False),  # not twice the references'
    (50, 0, False),  # not 5% of the sentences
    (57, 0, True),
])
def test_the_report_tells_of_translations_that_repeat_themselves(translations, references, told):
    from tfnmt.training.report import format_report, repeating

    assert repeating(["a b c a b c", "a b c d a b", "x y x y x", "", "a b"]) == 2
    report = {"sentences": 1136, "beam_size": 4, "alpha": 1.5, "checkpoint": "best/ckpt-9",
              "bleu": 24.6, "chrf": 43.5, "bleu_signature": "b", "chrf_signature": "c",
              "samples": [], "repeating": {"words": 3, "translations": translations,
                                           "references": references}}
    hint = (f"  {translations} of them repeat a sequence of 3 words ({references} of the "
            "references do): --no_repeat_ngram_size=4 forbids repeats; this command with it "
            "reports again (no more training) and keeps it for export.py, translate.py and "
            "evaluate.py (docs/serving.md, Repetitions)")
    assert (hint in format_report(report, "runs/de-en").splitlines()) == told
    # A report searched with the rule (train.py --no_repeat_ngram_size) names it, not the hint.
    ruled = format_report(dict(report, no_repeat_ngram_size=4), "runs/de-en").splitlines()
    assert ruled[0].startswith("test (1,136 sentences, beam 4, length penalty 1.5, no repeated "
                               "4-grams of subwords, best/ckpt-9): sacreBLEU 24.60")
    assert not any("forbids repeats" in line for line in ruled)
    del report["repeating"]  # a report.json written before it was counted
    assert "repeat" not in format_report(report, "runs/de-en")


class EndsEverywhere:
    """A model's logits with EOS made the most likely token at every position."""

    def __init__(self, model):
        self.model = model

    def __call__(self, inputs, training=False):
        logits = self.model(inputs, training=training)  # [B, T, V]
        return logits + 100.0 * tf.one_hot(EOS_ID, tf.shape(logits)[-1])


def test_the_reports_next_commands_run_as_printed_in_a_path_with_blanks(tmp_path):
    # Copied from the log into a shell, each command gets its paths as single words (a
    # model_dir with a blank was split in two).
    import shlex

    from tfnmt.training.report import next_commands

    model_dir = str(tmp_path / "my runs" / "de-en")
    export, translate, evaluate = next_commands(model_dir)
    assert shlex.split(export) == ["python", "export.py", f"--model_dir={model_dir}"]
    assert shlex.split(translate.split(" | ")[1]) == [
        "python", "translate.py", f"--export={model_dir}/export"]
    assert shlex.split(evaluate)[2] == f"--model_dir={model_dir}"
    assert next_commands("runs/de-en")[0] == "python export.py --model_dir=runs/de-en"


def test_dev_loss_is_the_mean_over_every_real_target_token_and_none_without_one(small_prepared):
    # float64 numpy from the model's logits, batch by batch: the smoothed target puts 1 - eps on
    # the label and eps / (V - 2) on every other token but padding (id 0); perplexity is exp of
    # the unsmoothed cross-entropy; accuracy counts argmax hits. All per real target token.
    model = Transformer(vocab_size=600, **get_preset("tiny", dropout=0.0))
    dev = make_dataset(small_prepared, "dev", 512, 64, shuffle=False)
    eps, totals, ends = 0.1, np.zeros(4), 0
    for batch in dev:
        logits = model((batch["source"], batch["target_in"]), training=False).numpy()
        log_p = logits.astype(np.float64)
        log_p -= np.log(np.exp(log_p - log_p.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            + log_p.max(-1, keepdims=True)
        labels = batch["target_out"].numpy()
        real = labels != 0
        q = np.full(log_p.shape, eps / (log_p.shape[-1] - 2))
        q[..., 0] = 0.0
        np.put_along_axis(q, labels[..., None], 1.0 - eps, axis=-1)
        nll = -np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
        totals += [(-(q * log_p).sum(-1) * real).sum(), (nll * real).sum(),
                   ((logits.argmax(-1) == labels) & real).sum(), real.sum()]
        ends += (labels == EOS_ID).sum()
    smoothed, nll, correct, tokens = totals
    assert sum(1 for _ in dev) > 1  # sums over several batches
    metrics = evaluate_loss(model, dev, label_smoothing=eps)
    assert metrics["loss"] == pytest.approx(smoothed / tokens, rel=1e-4)
    assert metrics["perplexity"] == pytest.approx(np.exp(nll / tokens), rel=1e-3)
    assert abs(metrics["accuracy"] - correct / tokens) <= 2 / tokens  # argmax ties may flip
    # The untrained model's accuracy is about 0: a model whose argmax is EOS everywhere hits
    # exactly the labels that are EOS, one per pair.
    assert evaluate_loss(EndsEverywhere(model), dev)["accuracy"] == pytest.approx(ends / tokens)
    # A max_length shorter than every dev pair leaves no token: no value, rather than a loss of
    # 0 and a perplexity of 1 that would pass for perfect (and win --best_metric=loss).
    histogram = records.load_manifest(small_prepared)["splits"]["dev"]["length_histogram"]
    shortest = min(int(length) for length, count in histogram.items() if count)
    nothing = make_dataset(small_prepared, "dev", 512, shortest - 1, shuffle=False)
    assert evaluate_loss(model, nothing) == {"loss": None, "perplexity": None,
                                             "accuracy": None}


def test_a_tsv_of_pairs_given_as_sentences_is_refused_by_evaluate_and_said_by_translate(
        tmp_path, tiny_model_dir):
    import gzip

    from helpers import python

    german = [f"Das ist Haus Nummer {n}." for n in range(40)]
    english = [f"This is house number {n}." for n in range(40)]
    (tmp_path / "dev.en").write_text("".join(f"{e}\n" for e in english))
    pairs = "".join(f"{g}\t{e}\n" for g, e in zip(german, english))
    (tmp_path / "dev.tsv").write_text(pairs)
    (tmp_path / "dev.tsv.gz").write_bytes(gzip.compress(pairs.encode()))
    tsv, gz, references = (str(tmp_path / name) for name in ("dev.tsv", "dev.tsv.gz", "dev.en"))
    stem = str(tmp_path / "dev")
    for args, advice in (
            ([f"--hypotheses={gz}", f"--reference={references}"],
             f"zcat {gz} | cut -f2 > {stem}.2 (the column that holds them); then "
             f"--hypotheses={stem}.2"),
            ([f"--source={tsv}", f"--reference={tsv}"],
             f"cut -f1 {tsv} > {stem}.1; cut -f2 {tsv} > {stem}.2; then --source={stem}.1 "
             f"--reference={stem}.2")):
        refused = python("evaluate.py", *args)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            f"evaluate.py: {args[0]}: 40 of its first 40 lines hold a tab: a TSV of pairs? "
            f"evaluate.py reads a sentence per line: {advice}")
    # Under 95% of the lines with a tab: sentences, scored (here against themselves).
    mixed = [f"{e}\tmore" for e in english[:37]] + english[37:]
    (tmp_path / "mixed.en").write_text("".join(f"{e}\n" for e in mixed))
    scored = python("evaluate.py", f"--hypotheses={tmp_path / 'mixed.en'}",
                    f"--reference={tmp_path / 'mixed.en'}")
    assert scored.returncode == 0, scored.stderr
    assert "BLEU   100.00" in scored.stdout
    (tmp_path / "mixed.en").write_text("".join(f"{e}\tmore\n" for e in english[:38])
                                       + "".join(f"{e}\n" for e in english[38:]))
    refused = python("evaluate.py", f"--hypotheses={references}",
                     f"--reference={tmp_path / 'mixed.en'}")
    assert refused.returncode == 1
    assert "--reference=" in refused.stderr and "38 of its first 40 lines" in refused.stderr
    # translate.py translates each line whole, and says so.
    translated = python("translate.py", f"--model_dir={tiny_model_dir}", f"--input={tsv}")
    assert translated.returncode == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == 40
    assert f"translate.py: --input {tsv}: 40 of its first 40 lines hold a tab: a TSV of " \
        "pairs? Each line is translated whole, tab and all (`cut -f1` gives the first " \
        "column)\n" in translated.stderr
    translated = python("translate.py", f"--model_dir={tiny_model_dir}", f"--input={references}")
    assert translated.returncode == 0 and "tab" not in translated.stderr
