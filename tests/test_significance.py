import itertools

import numpy as np
import pytest
import sacrebleu

from tfnmt.inference import significance
from tfnmt.inference.sacrebleu_scores import sacrebleu_metrics

WORDS = ("the a house is was red green big small old new we they saw found built near far "
         "river town road tree day night").split()


def _corpus(size, seed, drop=0.3):
    """References, and two systems' translations of them: each drops a word with probability
    `drop`, independently, so the systems differ a little in most sentences."""
    rng = np.random.default_rng(seed)
    references = [" ".join(rng.choice(WORDS, size=rng.integers(5, 12))) for _ in range(size)]

    def system():
        return [" ".join(w for w in line.split() if rng.random() > drop) or "the"
                for line in references]
    return references, system(), system()


def test_scores_are_sacrebleus_with_several_references():
    references, baseline, system = _corpus(40, seed=1)
    second = [line.upper() if i % 3 else line for i, line in enumerate(references)]
    compared = significance.compare(baseline, system, [references, second],
                                    sacrebleu_metrics(ter=True), trials=200, resamples=200)
    for name, score in (("bleu", sacrebleu.corpus_bleu), ("chrf", sacrebleu.corpus_chrf),
                        ("ter", sacrebleu.corpus_ter)):
        ours = compared[name]
        assert ours["baseline"] == pytest.approx(score(baseline, [references, second]).score)
        assert ours["system"] == pytest.approx(score(system, [references, second]).score)
        assert ours["difference"] == pytest.approx(ours["system"] - ours["baseline"])


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_p_is_that_of_exact_randomization(metric):
    """Against every one of the 2^N ways to swap the two systems' translations, each pair of
    corpora scored by sacreBLEU's public corpus_score: the share of swaps whose difference is
    at least the real one (exact randomization; approximate randomization estimates it)."""
    references, baseline, system = _corpus(10, seed=3)
    score = {"bleu": sacrebleu.corpus_bleu, "chrf": sacrebleu.corpus_chrf}[metric]

    def difference(swapped):
        ours = [s if swap else b for b, s, swap in zip(baseline, system, swapped)]
        theirs = [b if swap else s for b, s, swap in zip(baseline, system, swapped)]
        return score(theirs, [references]).score - score(ours, [references]).score

    real = difference([False] * 10)
    # A swap and its complement give opposite differences: half the patterns suffice.
    patterns = [(False,) + rest for rest in itertools.product((False, True), repeat=9)]
    exact = np.mean([abs(difference(p)) >= abs(real) - 1e-9 for p in patterns])
    assert 0.05 < exact < 0.95  # a difference that chance could give: p is informative
    compared = significance.compare(baseline, system, [references],
                                    sacrebleu_metrics())[metric]
    assert compared["difference"] == pytest.approx(real)
    # 10,000 trials: the estimate's standard error is at most 0.005.
    assert compared["p"] == pytest.approx(exact, abs=0.02)


def test_interval_is_that_of_a_paired_bootstrap():
    """Against a bootstrap by sacreBLEU's public corpus_bleu on resampled sentences, the
    same resample for both systems."""
    references, baseline, _ = _corpus(150, seed=5, drop=0.15)
    rng = np.random.default_rng(0)
    # The system: the baseline with the last word of a third of its sentences dropped.
    system = [line.rsplit(" ", 1)[0] if i % 3 == 0 and " " in line else line
              for i, line in enumerate(baseline)]
    differences = []
    for _ in range(300):
        drawn = rng.integers(len(references), size=len(references))
        refs = [[references[i] for i in drawn]]
        differences.append(sacrebleu.corpus_bleu([system[i] for i in drawn], refs).score
                           - sacrebleu.corpus_bleu([baseline[i] for i in drawn], refs).score)
    low, high = np.percentile(differences, [2.5, 97.5])
    ours = significance.compare(baseline, system, [references], sacrebleu_metrics())["bleu"]
    width = high - low
    assert ours["interval"][0] == pytest.approx(low, abs=0.15 * width)
    assert ours["interval"][1] == pytest.approx(high, abs=0.15 * width)
    assert ours["interval"][1] - ours["interval"][0] == pytest.approx(width, rel=0.2)
    # Unpaired resamples (each system on its own draw) would give a much wider interval.
    unpaired = []
    for _ in range(100):
        one, other = (rng.integers(len(references), size=len(references)) for _ in range(2))
        unpaired.append(
            sacrebleu.corpus_bleu([system[i] for i in one], [[references[i] for i in one]]).score
            - sacrebleu.corpus_bleu([baseline[i] for i in other],
                                    [[references[i] for i in other]]).score)
    assert np.ptp(np.percentile(unpaired, [2.5, 97.5])) > 1.5 * (ours["interval"][1]
                                                                  - ours["interval"][0])


def test_translations_that_differ_in_one_sentence_or_none_are_not_called_different():
    """sacreBLEU's PairedTest counts only shuffles whose difference exceeds the real one, and
    reports these at p = 1 / (trials + 1)."""
    references, baseline, _ = _corpus(60, seed=7)
    one_changed = list(baseline)
    one_changed[4] = "entirely other words"
    for system in (baseline, one_changed):
        compared = significance.compare(baseline, system, [references],
                                        sacrebleu_metrics(ter=True), trials=500)
        for name, test in compared.items():
            assert test["p"] == 1.0
            assert significance.verdict(name, test) == "no significant difference"
    assert compared["bleu"]["difference"] < 0 < compared["ter"]["difference"]


def test_verdict_reads_ter_as_lower_is_better():
    references, baseline, _ = _corpus(80, seed=9, drop=0.05)
    worse = [" ".join(line.split()[:2]) for line in baseline]
    compared = significance.compare(baseline, worse, [references],
                                    sacrebleu_metrics(ter=True), trials=500, resamples=200)
    assert compared["ter"]["difference"] > 0 and compared["bleu"]["difference"] < 0
    for name, test in compared.items():
        # No trial's difference is as large: p = 1 / (trials + 1), never 0.
        assert test["p"] == 1 / 501 and test["interval"][1] * test["difference"] > 0
        assert significance.verdict(name, test) == "worse"
    backwards = significance.compare(worse, baseline, [references],
                                     sacrebleu_metrics(ter=True), trials=500, resamples=200)
    assert {significance.verdict(name, test) for name, test in backwards.items()} == {"better"}


@pytest.mark.parametrize("baseline,system,references,message", [
    (["a b"], ["a b", "c d"], [["a b", "c d"]], "2 translations against 1 lines"),
    (["a b", "c d"], ["a b", "c d"], [["a b"]], "2 translations against 1 lines"),
    ([], [], [[]], "no sentences"),
])
def test_unequal_counts_are_refused(baseline, system, references, message):
    with pytest.raises(ValueError, match=message):
        significance.compare(baseline, system, references, sacrebleu_metrics())
