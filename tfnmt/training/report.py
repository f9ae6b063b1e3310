"""The end of a training run, told to its user: test scores of what export.py would export
(beam search, as served), a few translations beside their references, and what to run next.

Written to <model_dir>/report.json as well as printed."""
import json
import os

from tfnmt import paths
from tfnmt.checkpoints import load_model
from tfnmt.data.corpus import read_corpus
from tfnmt.data.vocabulary import Vocabulary
from tfnmt.inference import length_penalty
from tfnmt.inference.evaluation import Translator, corpus_scores, translate_lines
from tfnmt.inference.serving import TranslationModule

SAMPLES = 3


def pick_samples(pairs, count=SAMPLES, min_words=6, max_words=20):
    """Sample sentences for the report: spread evenly over the split, among those whose source has
    min_words..max_words words (long enough to show something, short enough to read); any pairs
    when too few qualify.

    Args:
      pairs: (source, reference) pairs.
      count: how many.
      min_words, max_words: the source's length in words.

    Returns:
      Indices into `pairs`.
    """
    readable = [i for i, (source, _) in enumerate(pairs)
                if min_words <= len(source.split()) <= max_words]
    pool = readable if len(readable) >= count else list(range(len(pairs)))
    if not pool:
        return []
    step = len(pool) / min(count, len(pool))
    return [pool[int(step * k + step / 2)] for k in range(min(count, len(pool)))]


def choose_length_penalty(model_dir, settings, beam_size=4, batch_size=64,
                          grid=length_penalty.ALPHA_GRID):
    """Chooses the beam search's length penalty on the dev split for the checkpoint export.py
    exports by default (`length_penalty.choose_alpha`) and writes it to
    <model_dir>/decoding.json.

    Args:
      model_dir: the run's model_dir.
      settings: the run's settings (its data section names the dev split).
      beam_size: the beam's width (as served).
      batch_size: sentences translated at once.
      grid: the alphas to try, in increasing order.

    Returns:
      (alpha, {alpha: dev sacreBLEU}); (None, {}) when the dev split holds no pairs.
    """
    import tensorflow as tf

    d = settings["data"]
    pairs = list(read_corpus(d["dataset"], "dev", (d.get("files") or {}).get("dev"),
                             d.get("tfds_data_dir")))
    if not pairs:
        return None, {}
    model, _, checkpoint = load_model(model_dir)
    vocabulary = Vocabulary.from_dir(model_dir, d.get("separate_vocabularies", False))
    alpha = tf.Variable(grid[0], trainable=False, dtype=tf.float32)  # one trace for all
    translator = Translator(model, vocabulary, batch_size=batch_size,
                            beam_size=beam_size, alpha=alpha)
    sources = [s for s, _ in pairs]

    def translate_with(value):
        alpha.assign(value)
        return translator.translate(sources)

    best, scores = length_penalty.choose_alpha(translate_with, [t for _, t in pairs], grid)
    length_penalty.write_choice(model_dir, best, beam_size, scores,
                                os.path.relpath(checkpoint, model_dir))
    return best, scores


def test_report(model_dir, settings, beam_size=4, alpha=0.6, batch_size=64):
    """Scores the test split with the checkpoint export.py exports by default, as served.

    Args:
      model_dir: the run's model_dir.
      settings: the run's settings (its data section names the test split).
      beam_size, alpha: the beam search's settings (paper: 4, 0.6).
      batch_size: sentences translated at once.

    Returns:
      {"split", "sentences", "beam_size", "alpha", "bleu", "chrf", their signatures,
      "samples", "checkpoint"}; None when the dataset has no test split (--dataset=files
      without --test_files).
    """
    d = settings["data"]
    files = (d.get("files") or {}).get("test")
    if d["dataset"] == "files" and not files:
        return None
    pairs = list(read_corpus(d["dataset"], "test", files, d.get("tfds_data_dir")))
    if not pairs:
        return None
    model, vocab, checkpoint = load_model(model_dir)
    module = TranslationModule(model, vocab, beam_size, alpha, n_best=1)

    def translate(sentences):
        out = module.serve(sentences)
        return out["translations"], out["scores"]

    hypotheses = translate_lines(translate, [s for s, _ in pairs], batch_size)
    report = {"split": "test", "sentences": len(pairs), "beam_size": beam_size, "alpha": alpha,
              "checkpoint": os.path.relpath(checkpoint, model_dir)}
    report.update(corpus_scores(hypotheses, [t for _, t in pairs], signatures=True))
    report["samples"] = [{"source": pairs[i][0], "reference": pairs[i][1],
                          "translation": hypotheses[i]} for i in pick_samples(pairs)]
    return report


def next_commands(model_dir):
    """The commands that export, translate and evaluate the trained model.

    Args:
      model_dir: the run's directory.

    Returns:
      A list of shell commands.
    """
    export_dir = os.path.join(model_dir, paths.EXPORT)
    return [f"python export.py --model_dir={model_dir}",
            f'echo "Das ist ein Haus." | python translate.py --export={export_dir}',
            f"python evaluate.py --model_dir={model_dir} --source=my.de --reference=my.en"]


def format_report(report, model_dir):
    """The end-of-run report as text.

    Args:
      report: `test_report`'s result, or None.
      model_dir: the run's directory.

    Returns:
      Lines: the test scores with their signatures and samples (when there is a report), then the
      next commands.
    """
    lines = []
    if report:
        lines.append(f"test ({report['sentences']:,d} sentences, beam {report['beam_size']}, "
                     f"length penalty {report['alpha']:g}, {report['checkpoint']}): sacreBLEU "
                     f"{report['bleu']:.2f} | chrF "
                     f"{report['chrf']:.2f}")
        lines.append(f"  BLEU  {report['bleu_signature']}")
        lines.append(f"  chrF2 {report['chrf_signature']}")
        for sample in report["samples"]:
            lines.append(f"  source       {sample['source']}")
            lines.append(f"  reference    {sample['reference']}")
            lines.append(f"  translation  {sample['translation']}")
    lines.append("next:")
    lines.extend(f"  {command}" for command in next_commands(model_dir))
    return "\n".join(lines)


def write_report(model_dir, report):
    """Writes <model_dir>/report.json atomically.

    Args:
      model_dir: the run's directory.
      report: a JSON-able dict.
    """
    path = os.path.join(model_dir, paths.REPORT)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    os.replace(path + ".tmp", path)
