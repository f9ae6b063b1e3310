"""The length penalty chosen on dev (tfnmt/inference/length_penalty.py) and its use."""
import json
import os
import shutil

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from tfnmt.checkpoints import ModelDirError, load_model
from tfnmt.data.special_tokens import EOS_ID
from tfnmt.data.vocabulary import Vocabulary
from tfnmt.inference import length_penalty, loading
from tfnmt.inference.evaluation import Translator
from tfnmt.inference.serving import TranslationModule
from tfnmt.training import report
from tfnmt.training.evaluator import Evaluator
from tfnmt.training.report import ServedTranslator

REFERENCES = ["the house is red and old .", "he spoke to them at night .", "good morning to all ."]
# Translations that grow with alpha: too short, right, too long.
BY_ALPHA = {0.6: ["the house .", "he spoke .", "good morning ."],
            1.0: ["the house is red .", "he spoke to them .", "good morning to all ."],
            1.4: ["the house is red and old .", "he spoke to them at night .",
                  "good morning to all ."],
            1.8: ["the house is red and old and big .", "he spoke to them at night and day .",
                  "good morning to all of you ."]}


def test_the_best_alpha_of_the_grid_is_chosen_and_the_search_stops_after_it():
    tried = []

    def translate_with(alpha):
        tried.append(alpha)
        return BY_ALPHA[alpha]

    best, scores = length_penalty.choose_alpha(translate_with, REFERENCES, tuple(BY_ALPHA))
    expected = {a: sacrebleu.corpus_bleu(BY_ALPHA[a], [REFERENCES]).score for a in BY_ALPHA}
    assert best == max(expected, key=expected.get) == 1.4
    assert tried == [0.6, 1.0, 1.4, 1.8]  # 1.8 scores below 1.4: the last one tried
    assert scores == pytest.approx({a: expected[a] for a in tried})
    # Stops at the first alpha no better than the one before; a tie keeps the smaller.
    tried.clear()
    flat = {0.6: BY_ALPHA[1.0], 1.0: BY_ALPHA[1.0], 1.4: BY_ALPHA[1.4]}
    best, scores = length_penalty.choose_alpha(lambda a: tried.append(a) or flat[a], REFERENCES,
                                               tuple(flat))
    assert best == 0.6 and tried == [0.6, 1.0] and set(scores) == {0.6, 1.0}


@pytest.mark.parametrize("peak", [-0.5, 0.1, 0.4, 0.55, 0.85, 1.0, 1.15, 1.3, 1.9, 2.5, 2.9])
def test_the_climb_from_a_default_finds_the_best_penalty_of_its_range(peak):
    # A score that peaks at `peak`: the climb from 1.0 (up by 0.3 while it rises, else down)
    # ends where scoring every penalty of its range, 0.1 to 2.5, finds the best (a tie: the
    # one nearer 1.0), scoring no penalty twice.
    tried = []

    def score(alpha):
        tried.append(alpha)
        return -round(abs(alpha - peak), 6)

    best, scores = length_penalty.climb_alpha(score)
    every = [round(0.1 + 0.3 * i, 6) for i in range(9)]
    assert best == max(every, key=lambda a: (-abs(a - peak), -abs(a - 1.0)))
    assert tried == sorted(scores, key=lambda a: (a < 1.0, abs(a - 1.0)))  # up first
    assert list(scores) == sorted(scores) and len(set(tried)) == len(tried)
    assert scores == {a: -round(abs(a - peak), 6) for a in tried}


@pytest.mark.parametrize("table,expected,tried", [
    ({0.7: 9.0, 1.0: 10.0, 1.3: 10.05, 1.6: 12.0}, 1.0, {0.7, 1.0, 1.3}),  # +0.05: no step
    ({0.1: 12.0, 0.4: 13.0, 0.7: 10.2, 1.0: 10.0, 1.3: 10.0}, 0.4, {0.1, 0.4, 0.7, 1.0, 1.3}),
    ({1.0: 10.0, 1.3: 10.2, 1.6: 10.25, 1.9: 11.0}, 1.3, {1.0, 1.3, 1.6}),  # +0.05: stops
])
def test_the_climb_takes_only_steps_that_gain_more_than_min_gain(table, expected, tried):
    best, scores = length_penalty.climb_alpha(table.__getitem__, min_gain=0.1)
    assert best == expected and scores == {a: table[a] for a in sorted(tried)}


@pytest.mark.parametrize("text,expected", [("auto", None), ("AUTO", None), ("1.4", 1.4),
                                           ("0", 0.0)])
def test_parse_alpha(text, expected):
    assert length_penalty.parse_alpha(text) == expected


@pytest.mark.parametrize("text", ["-0.5", "nan", "inf", "long", ""])
def test_parse_alpha_refuses(text):
    with pytest.raises(ValueError, match="give auto or a finite number >= 0"):
        length_penalty.parse_alpha(text)


def test_a_model_dir_keeps_its_choice(tmp_path):
    assert length_penalty.default_alpha(str(tmp_path)) == (0.6, "the paper's")
    length_penalty.write_choice(str(tmp_path), 1.4, 4, {0.6: 9.18, 1.0: 9.734, 1.4: 10.09},
                                "best/ckpt-10")
    path = os.path.join(str(tmp_path), "decoding.json")
    assert length_penalty.default_alpha(str(tmp_path)) == (1.4, f"from {path}")
    assert json.load(open(path)) == {"alpha": 1.4, "beam_size": 4, "chosen_on": "dev",
                                     "checkpoint": "best/ckpt-10",
                                     "dev_bleu": {"0.6": 9.18, "1": 9.73, "1.4": 10.09}}
    length_penalty.write_choice(str(tmp_path), 0.0)  # train.py --alpha=0
    assert json.load(open(path)) == {"alpha": 0.0, "beam_size": 4, "chosen_on": "--alpha"}
    with open(path, "w") as f:
        f.write("{not json")
    assert length_penalty.default_alpha(str(tmp_path)) == (0.6, f"the paper's; {path} is "
                                                                "unreadable")
    assert length_penalty.default_no_repeat(str(tmp_path)) == (0, f"{path} is unreadable")


def test_a_model_dir_keeps_its_no_repeat_rule(tmp_path):
    # train.py --no_repeat_ngram_size: kept beside alpha, the default of the other programs;
    # a file without it (a run without the rule, or of an older tfnmt) or with a value that is
    # not a count means none.
    path = os.path.join(str(tmp_path), "decoding.json")
    assert length_penalty.default_no_repeat(str(tmp_path)) == (0, "none")
    length_penalty.write_choice(str(tmp_path), 1.2, 4, {0.6: 9.0, 1.2: 9.5}, "best/ckpt-4",
                                no_repeat_ngram_size=3)
    assert json.load(open(path))["no_repeat_ngram_size"] == 3
    assert length_penalty.default_no_repeat(str(tmp_path)) == (3, f"from {path}")
    assert length_penalty.default_alpha(str(tmp_path)) == (1.2, f"from {path}")
    length_penalty.write_choice(str(tmp_path), 0.6, no_repeat_ngram_size=2,
                                chosen_on="the paper's: no dev pairs")
    assert json.load(open(path)) == {"alpha": 0.6, "beam_size": 4, "no_repeat_ngram_size": 2,
                                     "chosen_on": "the paper's: no dev pairs"}
    length_penalty.write_choice(str(tmp_path), 0.6)
    assert "no_repeat_ngram_size" not in json.load(open(path))
    assert length_penalty.default_no_repeat(str(tmp_path)) == (0, f"{path} holds none")
    for bad in (-1, 2.5, "4", True, None):
        with open(path, "w") as f:
            json.dump({"alpha": 0.6, "no_repeat_ngram_size": bad}, f)
        assert length_penalty.default_no_repeat(str(tmp_path)) == (0, f"{path} is unreadable")
    with open(path, "w") as f:
        f.write("[4]")
    assert length_penalty.default_no_repeat(str(tmp_path)) == (0, f"{path} is unreadable")
    assert length_penalty.default_alpha(str(tmp_path))[0] == 0.6


def test_one_trace_searches_with_whatever_alpha_its_variable_holds(tiny_model_dir, tmp_path):
    model, _, _ = load_model(tiny_model_dir)
    vocabulary = Vocabulary.from_dir(tiny_model_dir, separate=False)
    sentences = ["Das ist ein Haus.", "Guten Morgen!", "Er sprach zu ihnen in der Nacht."]
    alpha = tf.Variable(0.0, trainable=False)
    shared = Translator(model, vocabulary, beam_size=3, alpha=alpha)
    results = {}
    for value in (0.0, 2.0):
        alpha.assign(value)
        got = shared.translate_batch(sentences)
        want = Translator(model, vocabulary, beam_size=3, alpha=value).translate_batch(sentences)
        assert list(got[0].numpy()) == list(want[0].numpy())
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
        results[value] = got[1].numpy()
    assert np.abs(results[0.0] - results[2.0]).min() > 1e-3  # the penalty did change
    # A model_dir's decoding.json is the default of the Python loaders (translate.py,
    # evaluate.py), as of export.py.
    chosen = str(tmp_path / "chosen")
    shutil.copytree(tiny_model_dir, chosen)
    length_penalty.write_choice(chosen, 2.0)
    _, scores = loading.load_translate_fn(chosen, beam_size=3)(sentences)
    np.testing.assert_allclose(scores, results[2.0], rtol=1e-5)


def test_a_no_repeat_rule_kept_in_the_model_dir_is_the_loaders_default(tiny_model_dir,
                                                                       tmp_path):
    # train.py --no_repeat_ngram_size=N: the end of the run searches with the rule (its
    # ServedTranslator), and writes it to decoding.json, which translate.py's and
    # evaluate.py's loader then take (tests/test_beam_search.py checks the rule itself).
    sentences = ["Das ist ein Haus.", "Guten Morgen!", "Er sprach zu ihnen in der Nacht."]
    chosen = str(tmp_path / "chosen")
    shutil.copytree(tiny_model_dir, chosen)
    served = ServedTranslator(chosen, beam_size=3, no_repeat_ngram_size=2)
    with_rule = served.translate(sentences, 2.0)
    plain = ServedTranslator(chosen, beam_size=3).translate(sentences, 2.0)
    assert with_rule != plain  # the untrained model repeats pairs of subwords
    length_penalty.write_choice(chosen, 2.0, no_repeat_ngram_size=2)
    translations, _ = loading.load_translate_fn(chosen, beam_size=3)(sentences)
    assert [t.decode() for t in translations.numpy()] == with_rule


def repeated_ngrams(ids, n):
    """Brute force: how many of the rows' N-grams of subwords (up to EOS) repeat one before."""
    count = 0
    for row in np.asarray(ids):
        tokens = list(row[:list(row).index(EOS_ID)] if EOS_ID in row else row[row != 0])
        grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
        count += len(grams) - len(set(grams))
    return count


def test_beam_dev_evaluations_search_with_the_runs_no_repeat_rule(tiny_model_dir, small_corpus,
                                                                  small_prepared):
    # train.py --eval_beam_size=3 --no_repeat_ngram_size=2: the evaluations during the run
    # score the dev split under the rule the end of the run searches with.
    model, _, _ = load_model(tiny_model_dir)
    vocabulary = Vocabulary.from_dir(tiny_model_dir, separate=False)
    sentences = ["Das ist ein Haus.", "Guten Morgen!", "Er sprach zu ihnen in der Nacht."]
    ruled = Translator(model, vocabulary, beam_size=3, no_repeat_ngram_size=2)
    plain = Translator(model, vocabulary, beam_size=3)
    assert repeated_ngrams(plain._decode(plain.source_ids(sentences))[0], 2) > 0  # untrained
    assert repeated_ngrams(ruled._decode(ruled.source_ids(sentences))[0], 2) == 0
    assert ruled.translate(sentences) != plain.translate(sentences)
    settings = {"data": {"dataset": "files", "files": small_corpus, "max_length": 64},
                "train": {"eval_beam_size": 3, "batch_tokens": 512, "label_smoothing": 0.1,
                          "bleu_sentences": 4}}
    evaluator = Evaluator(model, vocabulary, settings, small_prepared, no_repeat_ngram_size=2)
    assert evaluator.translator.translate(sentences) == ruled.translate(sentences)


def test_the_end_of_a_run_translates_as_served_with_each_alpha_in_one_trace(tiny_model_dir):
    # train.py chooses alpha on dev and reports on test with one ServedTranslator: the
    # TranslationModule an export holds, its penalty a variable.
    translator = ServedTranslator(tiny_model_dir, beam_size=3, batch_size=2)
    model, vocabulary, _ = load_model(tiny_model_dir)
    sentences = ["Das ist ein Haus.", "Guten Morgen!", "Er sprach zu ihnen in der Nacht.", ""]
    outputs = {}
    for value in (0.0, 2.0):
        got = translator.translate(sentences, value)
        plain = TranslationModule(model, vocabulary, beam_size=3, alpha=value, n_best=1)
        want = plain.serve(tf.constant(sentences))
        assert got == [t.decode() for t in want["translations"].numpy()]
        # The variable still holds `value`: the scores are those of that penalty.
        scores = translator.module.serve(tf.constant(sentences))["scores"].numpy()
        np.testing.assert_allclose(scores, want["scores"].numpy(), rtol=1e-6)
        outputs[value] = scores[:3]
    assert np.abs(outputs[0.0] - outputs[2.0]).min() > 1e-3  # the penalty did change
    assert translator.module.serve.experimental_get_tracing_count() == 1
    assert translator.checkpoint == os.path.join("checkpoints", "ckpt-1")


def test_the_end_of_a_run_searches_the_whole_grid_at_once_as_served(tiny_model_dir):
    # choose_length_penalty translates dev once for every alpha of the grid: each alpha's
    # translations are what the served module gives under that alpha (one search per alpha,
    # `single`), batches of two sentences and an empty one included, from one trace per grid
    # (tests/test_beam_search.py checks the search against a plain one where alpha changes
    # the hypotheses). The test report then translates through that trace.
    translator = ServedTranslator(tiny_model_dir, beam_size=3, batch_size=2)
    single = ServedTranslator(tiny_model_dir, beam_size=3, batch_size=2)
    sentences = ["Das ist ein Haus.", "Guten Morgen!", "Er sprach zu ihnen in der Nacht.", "",
                 "Und Gott sprach: Es werde Licht."]
    grid = (0.0, 0.6, 2.0, 5.0)
    translations = translator.translate_alphas(sentences, grid)
    assert list(translations) == list(grid)
    for alpha in grid:
        assert translations[alpha] == single.translate(sentences, alpha), alpha
    assert translations[0.0][3] == ""
    assert translator.translate_alphas(sentences[:2], grid) == {
        alpha: translations[alpha][:2] for alpha in grid}
    assert translator.translate(sentences, 2.0) == translations[2.0]
    assert [f.experimental_get_tracing_count()
            for f in translator._grid_searches.values()] == [1]
    assert translator.module.serve.experimental_get_tracing_count() == 0
    # Column m is alphas[m]: the scores (which the penalty changes even where this untrained
    # model's translations stay the same) are the served module's under each.
    batch = tf.constant(sentences)
    scores = translator.module.translate_batch(batch, 1, alphas=grid)[1].numpy()  # [B, M]
    for m, alpha in enumerate(grid):
        single.translate(sentences[:1], alpha)  # the module's variable now holds alpha
        np.testing.assert_allclose(scores[:, m], single.module.serve(batch)["scores"],
                                   rtol=1e-5, err_msg=str(alpha))
    assert np.abs(scores[:, 0] - scores[:, -1]).max() > 1e-2
    with pytest.raises(ValueError, match="n_best=1"):
        translator.module.translate_batch(batch, 2, alphas=grid)


def test_an_end_of_run_that_translates_nothing_loads_nothing(tmp_path):
    # A run with --dataset=files, no --test_files and a given alpha translates nothing at its
    # end: the translator must not load (here it could not: the model_dir holds no model).
    translator = ServedTranslator(str(tmp_path))
    settings = {"data": {"dataset": "files", "files": {"train": "x.de,x.en"}}}
    assert report.test_report(translator, settings, alpha=1.0) is None
    with pytest.raises(ModelDirError, match="holds no trained model"):  # the first use loads
        translator.translate(["Das ist ein Haus."], 1.0)
