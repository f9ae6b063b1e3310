"""The end of a run's length-penalty choice, timed: a model_dir's dev split translated under
every alpha of the grid in one beam search (`ServedTranslator.translate_alphas`, what train.py
does) against one search per alpha (`ServedTranslator.translate`), alternating over --rounds.
Checks that each alpha's translations are the same both ways and prints one JSON line: the
seconds of each way per round (the first round's include each way's trace), dev sacreBLEU per
alpha, and the ratio of the medians.

  python bench/alpha_grid.py --model_dir=runs/de-en
"""
import json
import os
import statistics
import time

from common import KERNELS, cpu_description

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A trained run's model_dir (its dev split is used).")
flags.DEFINE_integer("rounds", 3, "Rounds of both ways, alternating (the first also traces).")
flags.mark_flag_as_required("model_dir")


def main(_):
    from tfnmt.data.corpus import read_split
    from tfnmt.inference.sacrebleu_scores import corpus_scores
    from tfnmt.inference.length_penalty import ALPHA_GRID
    from tfnmt.paths import SETTINGS
    from tfnmt.training.report import ServedTranslator

    with open(os.path.join(FLAGS.model_dir, SETTINGS)) as f:
        settings = json.load(f)
    pairs = list(read_split(settings["data"], "dev"))
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    grid, each = ServedTranslator(FLAGS.model_dir), ServedTranslator(FLAGS.model_dir)
    seconds = {"one_search": [], "search_per_alpha": []}
    for _ in range(FLAGS.rounds):
        start = time.perf_counter()
        together = grid.translate_alphas(sources, ALPHA_GRID)
        seconds["one_search"].append(round(time.perf_counter() - start, 2))
        start = time.perf_counter()
        apart = {alpha: each.translate(sources, alpha) for alpha in ALPHA_GRID}
        seconds["search_per_alpha"].append(round(time.perf_counter() - start, 2))
        if together != apart:
            raise SystemExit("the grid search's translations differ from one search per alpha "
                             f"under {[a for a in ALPHA_GRID if together[a] != apart[a]]}")
    medians = {way: statistics.median(s) for way, s in seconds.items()}
    print(json.dumps({
        "machine": cpu_description(), "kernels": KERNELS, "model_dir": FLAGS.model_dir,
        "dev_sentences": len(sources), "alphas": ALPHA_GRID, "seconds": seconds,
        "same_translations": True,
        "dev_bleu": {str(a): round(corpus_scores(together[a], references)["bleu"], 2)
                     for a in ALPHA_GRID},
        "speedup_of_medians": round(medians["search_per_alpha"] / medians["one_search"], 2)}))


if __name__ == "__main__":
    app.run(main)
