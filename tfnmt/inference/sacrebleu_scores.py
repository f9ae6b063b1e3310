"""sacreBLEU's corpus scores of detokenized translations (the scores papers report): BLEU,
chrF and TER, with the signatures that say how each was computed. No TensorFlow: evaluate.py
scores files of translations with it alone."""
import sacrebleu

from tfnmt.inference import bleu_tokenization


def sacrebleu_metrics(tokenize="13a", ter=False):
    """{"bleu", "chrf"[, "ter"]: sacreBLEU's metric objects}, as `corpus_scores` scores with
    them (its `tokenize` and `ter`)."""
    metrics = {"bleu": sacrebleu.metrics.BLEU(tokenize=tokenize),
               "chrf": sacrebleu.metrics.CHRF()}
    if ter:
        unspaced = tokenize in bleu_tokenization.UNSPACED
        metrics["ter"] = sacrebleu.metrics.TER(normalized=unspaced, asian_support=unspaced)
    return metrics


def corpus_scores(hypotheses, references, ter=False, signatures=False, more_references=(),
                  tokenize="13a"):
    """Corpus scores with sacreBLEU: BLEU, chrF, TER.

    Args:
      hypotheses: translations, one per reference.
      references: one reference per sentence.
      ter: also compute TER.
      signatures: also return "<metric>_signature", the strings that say exactly how each
        score was computed.
      more_references: further references per sentence, each a list like `references`
        (sacreBLEU's multi-reference scores; the signatures say nrefs).
      tokenize: BLEU's tokenization (`bleu_tokenization.TOKENIZATIONS`; sacreBLEU's default
        13a). For text written without spaces (zh, char, ja-mecab) TER normalizes with
        sacreBLEU's Asian-script support.

    Returns:
      {"bleu", "chrf"[, "ter"][, "<metric>_signature"...]}.

    Raises:
      ValueError: no sentences, or unequal counts."""
    hypotheses = list(hypotheses)
    streams = [list(references)] + [list(more) for more in more_references]
    for stream in streams:
        if len(hypotheses) != len(stream):
            raise ValueError(f"{len(hypotheses)} hypotheses for {len(stream)} references: "
                             "scores need one hypothesis per reference")
    if not hypotheses:
        raise ValueError("no sentences to score")
    scores = {}
    for name, metric in sacrebleu_metrics(tokenize, ter).items():
        scores[name] = metric.corpus_score(hypotheses, streams).score
        if signatures:
            scores[f"{name}_signature"] = str(metric.get_signature())
    return scores
