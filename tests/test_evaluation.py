import pytest
import sacrebleu

from tfnmt.evaluation import corpus_scores


def test_corpus_scores_are_sacrebleus():
    hypotheses = ["The house is red.", "Good morning!", "He spoke to them."]
    references = ["The house is red.", "Good morning, all!", "He said to them."]
    scores = corpus_scores(hypotheses, references)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert 0 < scores["bleu"] < 100
    assert corpus_scores(references, references)["bleu"] == pytest.approx(100)


@pytest.mark.parametrize("hypotheses,references,message", [
    (["a b c", "d e f", "g h i"], ["a b c", "d e f"], "3 hypotheses for 2 references"),
    (["a b c"], ["a b c", "d e f"], "1 hypotheses for 2 references"),
    ([], [], "no sentences"),
])
def test_corpus_scores_refuse_what_cannot_be_scored(hypotheses, references, message):
    with pytest.raises(ValueError, match=message):
        corpus_scores(hypotheses, references)
