"""Is one system's corpus score better than another's on the same sentences, or chance?

`compare` tests each metric's difference between two systems' translations of the same
sentences against the same references:

- p: paired approximate randomization (Riezler and Maxwell, 2005; sacreBLEU's default paired
  test): each trial swaps the two systems' translations of a random half of the sentences and
  re-scores both corpora; p = (r + 1) / (trials + 1), where r counts the trials whose
  difference is at least as large as the real one.
- the 95% confidence interval of the difference: paired bootstrap resampling (Koehn, 2004):
  both systems re-scored on the same resampled sentences, the 2.5th and 97.5th percentiles.

Each trial re-scores from sacreBLEU's per-sentence sufficient statistics (n-gram matches and
lengths for BLEU, character and word n-gram counts for chrF, edits and reference lengths for
TER) with sacreBLEU's own formulas, through the two methods its `significance` module uses
(`_extract_corpus_statistics`, `_compute_score_from_stats`; sacrebleu is pinned in
requirements.txt). Not `sacrebleu.significance.PairedTest` itself: it counts only trials whose
difference exceeds the real one, so two systems whose translations differ in one sentence,
or not at all, come out different at p = 1 / (trials + 1).

Example:

  metrics = {"bleu": sacrebleu.metrics.BLEU(), "chrf": sacrebleu.metrics.CHRF()}
  compare(baseline_lines, system_lines, [reference_lines], metrics)
  # {"bleu": {"baseline": 23.9, "system": 25.0, "difference": 1.07,
  #           "interval": (0.41, 1.75), "p": 0.0021}, "chrf": {...}}
"""
import numpy as np

TRIALS = 10_000  # sacreBLEU's default number of approximate randomization trials
RESAMPLES = 1_000  # and of bootstrap resamples
SEED = 12345  # sacreBLEU's default seed: the same inputs give the same figures
LEVEL = 0.05  # what `verdict` calls significant
LOWER_IS_BETTER = ("ter",)
_ROWS = 250  # trials (or resamples) scored per matrix product: bounds their memory


def compare(baseline, system, references, metrics, trials=TRIALS, resamples=RESAMPLES,
            seed=SEED):
    """Each metric's scores of `baseline` and `system`, their difference and its test.

    Args:
      baseline, system: the two systems' translations, one per sentence, in the same order.
      references: a list of reference streams, each one reference per sentence.
      metrics: {name: a sacrebleu.metrics object (BLEU, CHRF, TER)}.
      trials: approximate randomization trials (the p-value's resolution: 1 / (trials + 1)).
      resamples: bootstrap resamples for the confidence interval.
      seed: seed of both random draws.

    Returns:
      {name: {"baseline", "system", "difference" (system - baseline), "interval" (low, high:
      the difference's 95% confidence interval), "p"}}.

    Raises:
      ValueError: no sentences, or unequal counts."""
    baseline, system = list(baseline), list(system)
    references = [list(stream) for stream in references]
    if not system:
        raise ValueError("no sentences to compare")
    for lines in [baseline] + references:
        if len(lines) != len(system):
            raise ValueError(f"{len(system)} translations against {len(lines)} lines: a "
                             "comparison needs one line of each per sentence")
    results = {}
    for name, metric in metrics.items():
        base_stats = _statistics(metric, baseline, references)  # [N, K]
        system_stats = _statistics(metric, system, references)
        base_score = _score(metric, base_stats.sum(0))
        system_score = _score(metric, system_stats.sum(0))
        difference = system_score - base_score
        # The same draws for every metric: a generator seeded alike for each.
        rng = np.random.default_rng(seed)
        shuffled = np.concatenate([
            _swapped_differences(metric, base_stats, system_stats, rng, rows)
            for rows in _blocks(trials)])
        # - 1e-9: a trial equal to the real arrangement sums its counts (TER's are fractions)
        # in another order.
        as_large = int(np.sum(np.abs(shuffled) >= abs(difference) - 1e-9))
        resampled = np.concatenate([
            _resampled_differences(metric, base_stats, system_stats, rng, rows)
            for rows in _blocks(resamples)])
        low, high = np.percentile(resampled, [2.5, 97.5])
        results[name] = {"baseline": base_score, "system": system_score,
                         "difference": difference, "interval": (float(low), float(high)),
                         "p": (as_large + 1) / (trials + 1)}
    return results


def verdict(name, result, level=LEVEL):
    """"better", "worse" or "no significant difference": the system against the baseline."""
    if result["p"] >= level or result["difference"] == 0:
        return "no significant difference"
    improved = (result["difference"] < 0) == (name in LOWER_IS_BETTER)
    return "better" if improved else "worse"


def _statistics(metric, hypotheses, references):
    """sacreBLEU's sufficient statistics of each sentence: [N, K] float64."""
    return np.asarray(metric._extract_corpus_statistics(hypotheses, references),
                      dtype=np.float64)


def _score(metric, totals):
    return float(metric._compute_score_from_stats(totals).score)


def _scores(metric, totals):
    return np.array([_score(metric, row) for row in totals])


def _swapped_differences(metric, base_stats, system_stats, rng, rows):
    """Approximate randomization: the difference (system - baseline) of `rows` trials, each
    with the two translations of a random half of the sentences swapped."""
    swaps = rng.integers(2, size=(rows, len(base_stats))).astype(np.float64)  # [R, N], 1: swap
    # A trial's corpora differ from the originals' sums by swaps @ (system - baseline).
    moved = swaps @ (system_stats - base_stats)  # [R, K]
    return (_scores(metric, system_stats.sum(0) - moved)
            - _scores(metric, base_stats.sum(0) + moved))


def _resampled_differences(metric, base_stats, system_stats, rng, rows):
    """Paired bootstrap: the difference (system - baseline) on `rows` resamples of the
    sentences (drawn with replacement, the same sentences for both systems)."""
    count = len(base_stats)
    drawn = np.zeros((rows, count))  # [R, N]: how often each sentence is drawn
    np.add.at(drawn, (np.arange(rows)[:, None], rng.integers(count, size=(rows, count))), 1.0)
    return _scores(metric, drawn @ system_stats) - _scores(metric, drawn @ base_stats)


def _blocks(total):
    """Row counts of at most `_ROWS` that add up to total: bounds the draws' memory
    ([_ROWS, N] floats)."""
    return [min(_ROWS, total - start) for start in range(0, total, _ROWS)]
