"""The beam search's length penalty chosen on the dev split, for one trained model.

A model trained for a few thousand updates ends its translations early: on the main job's
dev split, beam 4 with the paper's alpha 0.6 gives outputs ~15% shorter than the references,
and sacreBLEU's brevity penalty takes a point or more. At the end of a run `train.py`
translates the dev split with beam 4 under each alpha of a small grid, all in one search
(`beam_search.AlphaGridBeamSearch`), keeps the best (`choose_alpha`) and writes it to
<model_dir>/decoding.json; export.py, translate.py and
evaluate.py take it as their `--alpha` for that model_dir unless one is given
(`default_alpha`). The file also keeps train.py's `--no_repeat_ngram_size`, which they take the
same way (`default_no_repeat`).

    python train.py --alpha=auto      # the default: chosen on dev at the end of the run
    python train.py --alpha=0.6       # fixed
"""
import json
import math
import os

from tfnmt.paths import DECODING, write_atomically

PAPER_ALPHA = 0.6
# Tried in order until one scores no better than the one before. Steps of 0.3: on eight main
# jobs they chose as well as steps of 0.6 or better (bench/README.md, "The length penalty");
# one dev search translates under all of them.
ALPHA_GRID = (0.6, 0.9, 1.2, 1.5, 1.8, 2.1, 2.4)


def parse_alpha(text):
    """train.py's --alpha: "auto" -> None (choose on dev), else a finite float >= 0.

    Raises:
      ValueError: neither "auto" nor a finite number >= 0.
    """
    if str(text).strip().lower() == "auto":
        return None
    try:
        alpha = float(text)
    except ValueError:
        alpha = -1.0
    if not 0.0 <= alpha < math.inf:  # also NaN
        raise ValueError(f"--alpha={text}: give auto or a finite number >= 0")
    return alpha


def choose_alpha(translate_with, references, grid=ALPHA_GRID, tokenize="13a"):
    """The grid's alpha whose translations score the highest sacreBLEU.

    Args:
      translate_with: a function alpha -> translations (a list of str, one per reference).
      references: the references.
      grid: alphas in increasing order. Scores rise with alpha while the outputs are too
        short and fall once they are too long, so the search stops at the first alpha that
        does not score above the one before (a tie keeps the smaller).
      tokenize: sacreBLEU's tokenization of the target language (`bleu_tokenization`).

    Returns:
      (the best alpha, {alpha: sacreBLEU} of the alphas tried).
    """
    from tfnmt.inference.sacrebleu_scores import corpus_scores

    scores, best = {}, None
    for alpha in grid:
        scores[alpha] = corpus_scores(translate_with(alpha), references,
                                      tokenize=tokenize)["bleu"]
        if best is not None and scores[alpha] <= scores[best]:
            break
        best = alpha
    return best, scores


def climb_alpha(score, start=1.0, step=0.3, lowest=0.1, highest=2.5, min_gain=0.0):
    """A penalty chosen by climbing from `start`: up in steps of `step` while the score rises by
    more than `min_gain`; where the first step up does not, down the same way. For a penalty
    without a grid of its own (CTranslate2's length_penalty, whose default is 1.0): the choice
    scores at least as high as `start`, and moves from it only for a clear gain.

    Args:
      score: a function alpha -> its score (higher is better), called once per alpha tried.
      start, step: where the climb starts, and its step.
      lowest, highest: the range it stays in.
      min_gain: how much more a step must score to be taken.

    Returns:
      (the alpha chosen, {alpha: score} of the alphas tried, in increasing order).
    """
    scores = {start: score(start)}
    best = start
    for direction in (1, -1):
        while lowest - 1e-9 <= (next_alpha := round(best + direction * step, 6)) <= highest + 1e-9:
            if next_alpha not in scores:
                scores[next_alpha] = score(next_alpha)
            if scores[next_alpha] <= scores[best] + min_gain:
                break
            best = next_alpha
        if best != start:
            break
    return best, dict(sorted(scores.items()))


def write_choice(model_dir, alpha, beam_size=4, scores=None, checkpoint=None,
                 no_repeat_ngram_size=0, chosen_on=None):
    """Writes <model_dir>/decoding.json (atomically).

    Args:
      model_dir: the run's directory.
      alpha: the length penalty to decode this model with.
      beam_size: the beam it was chosen with.
      scores: {alpha: dev sacreBLEU} when chosen on dev; None when given (train.py --alpha).
      checkpoint: the checkpoint it was chosen for, relative to model_dir.
      no_repeat_ngram_size: N > 0: the searches forbid repeating a sequence of N subwords
        (kept only when N > 0).
      chosen_on: how alpha was chosen (default "dev" with scores, else "--alpha").
    """
    chosen_on = chosen_on or ("dev" if scores else "--alpha")
    choice = {"alpha": alpha, "beam_size": beam_size, "chosen_on": chosen_on}
    if no_repeat_ngram_size:
        choice["no_repeat_ngram_size"] = int(no_repeat_ngram_size)
    if scores:
        choice.update(checkpoint=checkpoint,
                      dev_bleu={f"{a:g}": round(s, 2) for a, s in scores.items()})
    write_atomically(os.path.join(model_dir, DECODING), json.dumps(choice, indent=2))


def _choice(model_dir):
    """(decoding.json's dict or None where it is missing, its path or None); raises ValueError
    where it cannot be read as a JSON object."""
    path = os.path.join(model_dir, DECODING) if model_dir else None
    if not path or not os.path.exists(path):
        return None, path
    try:
        with open(path) as f:
            choice = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(path) from error
    if not isinstance(choice, dict):
        raise ValueError(path)
    return choice, path


def default_alpha(model_dir):
    """The alpha to search with for a model_dir: the one decoding.json holds, else 0.6.

    Returns:
      (alpha, where it came from, for the log).
    """
    try:
        choice, path = _choice(model_dir)
        if choice is None:
            return PAPER_ALPHA, "the paper's"
        alpha = float(choice["alpha"])
        if alpha >= 0:
            return alpha, f"from {path}"
    except (ValueError, KeyError, TypeError):
        pass  # unreadable: the paper's value, said so
    return PAPER_ALPHA, f"the paper's; {os.path.join(model_dir, DECODING)} is unreadable"


def is_ngram_count(value):
    """Whether a kept no-repeat rule (decoding.json's, a CTranslate2 model's tfnmt.json) reads
    as one: an int >= 0, not a bool (JSON's true would pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def default_no_repeat(model_dir):
    """The no-repeat rule to search with for a model_dir: the N of train.py's
    --no_repeat_ngram_size that decoding.json holds, else 0 (repeats allowed; also where the
    file is unreadable).

    Returns:
      (N, where it came from, for the log).
    """
    try:
        choice, path = _choice(model_dir)
    except ValueError:
        return 0, f"{os.path.join(model_dir, DECODING)} is unreadable"
    if choice is None:
        return 0, "none"
    if "no_repeat_ngram_size" not in choice:
        return 0, f"{path} holds none"
    size = choice["no_repeat_ngram_size"]
    if not is_ngram_count(size):
        return 0, f"{path} is unreadable"
    return size, f"from {path}"
