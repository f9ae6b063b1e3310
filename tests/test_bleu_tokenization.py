"""BLEU's tokenization by the target language's script: the choice, the scores it gives
against a BLEU counted by hand, and where train.py and evaluate.py use it."""
import collections
import json
import math

import pytest
import sacrebleu

from helpers import python
from tfnmt.inference import bleu_tokenization
from tfnmt.inference.sacrebleu_scores import corpus_scores
from tfnmt.training.evaluator import run_bleu_tokenization

CHINESE = (["我们今天去公园散步。", "他喜欢读书和写作。", "这本书很有意思。"],
           ["我们今天去公园走走。", "他喜欢读书与写作。", "这本书非常有意思。"])
JAPANESE = (["私は昨日東京へ行きました。", "この本はとても面白いです。"],
            ["私は昨日東京に行きました。", "この本は大変面白いです。"])


def bleu_by_hand(hypotheses, references):
    """Corpus BLEU (4-grams, one reference, no smoothing) over token lists, from its
    definition: clipped n-gram matches over n-gram counts, times the brevity penalty."""
    log_precisions = []
    for n in range(1, 5):
        matches = total = 0
        for hypothesis, reference in zip(hypotheses, references):
            ours = collections.Counter(tuple(hypothesis[i:i + n])
                                       for i in range(len(hypothesis) - n + 1))
            theirs = collections.Counter(tuple(reference[i:i + n])
                                         for i in range(len(reference) - n + 1))
            matches += sum(min(count, theirs[gram]) for gram, count in ours.items())
            total += max(len(hypothesis) - n + 1, 0)
        log_precisions.append(math.log(matches / total))
    length = sum(map(len, hypotheses))
    reference_length = sum(map(len, references))
    brevity = 1.0 if length > reference_length else math.exp(1 - reference_length / length)
    return 100 * brevity * math.exp(sum(log_precisions) / 4)


@pytest.mark.parametrize("references, expected", [
    (CHINESE[1], "zh"),
    (JAPANESE[1], "char"),
    (["ฉันชอบกินข้าวผัดมาก", "วันนี้อากาศดีมาก"], "char"),          # Thai
    (["Und Gott sprach: Es werde Licht.", "Das Haus ist klein."], "13a"),
    (["나는 학생입니다.", "오늘 날씨가 좋습니다."], "13a"),            # Korean: spaced words
    (["The road from 北京 to the coast is long and very busy today."], "13a"),
    ([], "13a"),
    (["123 456", "!?"], "13a"),                                      # no letters
])
def test_auto_chooses_by_the_references_script(references, expected):
    tokenization, why = bleu_tokenization.detect(references)
    assert tokenization == expected
    assert bool(why) == (expected != "13a")
    assert bleu_tokenization.resolve("auto", references) == (tokenization, why)
    assert bleu_tokenization.resolve("intl", references) == ("intl", "")


@pytest.mark.parametrize("text, tokenization", [(CHINESE, "zh"), (JAPANESE, "char")])
def test_scores_count_the_words_of_text_without_spaces(text, tokenization):
    hypotheses, references = text
    # Every character is a word here (CJK punctuation included).
    expected = bleu_by_hand([list(h) for h in hypotheses], [list(r) for r in references])
    scores = corpus_scores(hypotheses, references, ter=True, signatures=True,
                           tokenize=tokenization)
    assert scores["bleu"] == pytest.approx(expected, abs=1e-9) and expected > 40
    assert f"tok:{tokenization}" in scores["bleu_signature"]
    assert "asian:yes" in scores["ter_signature"] and scores["ter"] < 30
    # As words split at spaces, each sentence is one word, and none matches.
    assert corpus_scores(hypotheses, references)["bleu"] == 0.0


def test_scores_of_spaced_text_keep_sacrebleus_defaults():
    hypotheses = ["the old house by the river is small ."]
    references = ["the old house by the river is very small ."]
    scores = corpus_scores(hypotheses, references, ter=True, signatures=True)
    expected = bleu_by_hand([h.split() for h in hypotheses], [r.split() for r in references])
    assert scores["bleu"] == pytest.approx(expected, abs=1e-9)
    assert "tok:13a" in scores["bleu_signature"] and "asian:no" in scores["ter_signature"]


def test_a_runs_tokenization_follows_the_target_side_of_its_dev_split(tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text("".join(f"{en}\t{zh}\n" for en, zh in zip(
        ["We walk in the park today.", "He likes reading and writing.", "This book is fun."],
        CHINESE[1])), encoding="utf-8")
    data = {"dataset": "files", "files": {"dev": str(dev)}}
    settings = {"data": data, "train": {"bleu_tokenize": "auto"}}
    tokenization, why = run_bleu_tokenization(settings)
    assert tokenization == "zh" and "the references are Chinese" in why
    reverse = {"data": dict(data, reverse=True), "train": {"bleu_tokenize": "auto"}}
    assert run_bleu_tokenization(reverse) == ("13a", "")
    # Given: taken as it is; a run saved before the setting existed chooses automatically.
    assert run_bleu_tokenization({"data": data, "train": {"bleu_tokenize": "13a"}}) == ("13a", "")
    assert run_bleu_tokenization({"data": data, "train": {}})[0] == "zh"


def test_tokenizations_that_need_other_packages_say_which():
    for tokenization, language in (("ja-mecab", "ja"), ("ko-mecab", "ko")):
        try:  # sacreBLEU's own check: it raises when its extra packages are missing
            sacrebleu.metrics.BLEU(tokenize=tokenization)
            installed = True
        except RuntimeError:
            installed = False
        if installed:
            bleu_tokenization.check_available(tokenization)
        else:
            with pytest.raises(ValueError, match=rf'pip install "sacrebleu\[{language}\]"'):
                bleu_tokenization.check_available(tokenization)
    for tokenization in bleu_tokenization.CHOICES:
        if not tokenization.endswith("mecab"):
            bleu_tokenization.check_available(tokenization)
    with pytest.raises(ValueError, match="one of auto, 13a"):
        bleu_tokenization.check_available("flores200")  # it would download a model


def test_evaluate_py_scores_chinese_as_sacrebleu_does_for_it(tmp_path):
    hypotheses, references = tmp_path / "zh.hyp", tmp_path / "zh.ref"
    hypotheses.write_text("\n".join(CHINESE[0]) + "\n", encoding="utf-8")
    references.write_text("\n".join(CHINESE[1]) + "\n", encoding="utf-8")
    result = python("evaluate.py", f"--hypotheses={hypotheses}", f"--reference={references}",
                    "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads(result.stdout.splitlines()[-1])
    expected = bleu_by_hand([list(h) for h in CHINESE[0]], [list(r) for r in CHINESE[1]])
    assert scores["bleu"] == pytest.approx(expected, abs=1e-9)
    assert "tok:zh" in scores["bleu_signature"] and "asian:yes" in scores["ter_signature"]
