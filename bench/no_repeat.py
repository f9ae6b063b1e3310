"""Beam search without repeated n-grams (`--no_repeat_ngram_size`), measured on a model_dir's
dev and test splits: for each N of --sizes, sacreBLEU's BLEU, chrF and TER, each metric's
difference from N = 0 with its paired test (`significance.compare`: 95% bootstrap interval,
approximate randomization p-value), the test split's translation seconds (traced on dev first)
and their ratio to N = 0's. Beam 4 with the model_dir's length penalty
(<model_dir>/decoding.json). One JSON line.

  python bench/no_repeat.py --model_dir=runs/de-en
"""
import json
import time

from common import KERNELS, cpu_description

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A trained run's model_dir (its dev and test splits).")
flags.DEFINE_list("sizes", ["0", "3", "4", "5", "6"], "The n-gram sizes to try; 0 (no rule) "
                  "is the baseline and is always tried.")
flags.mark_flag_as_required("model_dir")
METRICS = ("bleu", "chrf", "ter")


def main(_):
    from tfnmt.data.corpus import read_split
    from tfnmt.inference import loading, significance
    from tfnmt.inference.batching import translate_lines
    from tfnmt.inference.sacrebleu_scores import sacrebleu_metrics
    from tfnmt.paths import read_settings
    from tfnmt.training.evaluator import run_bleu_tokenization

    sizes = sorted({0, *(int(n) for n in FLAGS.sizes)})
    settings = read_settings(FLAGS.model_dir)
    splits = {split: list(read_split(settings["data"], split)) for split in ("dev", "test")}
    metrics = sacrebleu_metrics(run_bleu_tokenization(settings, splits["test"])[0], ter=True)
    translations, seconds = {}, {}
    for n in sizes:
        translate = loading.load_translate_fn(FLAGS.model_dir, no_repeat_ngram_size=n)
        for split, pairs in splits.items():  # dev first: it also traces
            start = time.perf_counter()
            translations[split, n] = translate_lines(translate, [s for s, _ in pairs], 32)
            seconds[split, n] = time.perf_counter() - start
    results = {}
    for split, pairs in splits.items():
        references = [[t for _, t in pairs]]
        for n in sizes:
            compared = significance.compare(translations[split, 0], translations[split, n],
                                            references, metrics)
            results.setdefault(split, {})[str(n)] = {name: {
                "score": round(compared[name]["system"], 2),
                "difference": round(compared[name]["difference"], 2),
                "interval": [round(x, 2) for x in compared[name]["interval"]],
                "p": round(compared[name]["p"], 4),
                "verdict": significance.verdict(name, compared[name])} for name in METRICS}
    print(json.dumps({
        "machine": cpu_description(), "kernels": KERNELS, "model_dir": FLAGS.model_dir,
        "sentences": {split: len(pairs) for split, pairs in splits.items()},
        "against_size_0": results,
        "test_seconds": {str(n): round(seconds["test", n], 2) for n in sizes},
        "test_seconds_ratio": {str(n): round(seconds["test", n] / seconds["test", 0], 3)
                               for n in sizes}}))


if __name__ == "__main__":
    app.run(main)
