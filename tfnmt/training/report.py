"""The end of a training run, told to its user: test scores of what export.py would export
(beam search, as served), a few translations beside their references, and what to run next.

Written to <model_dir>/report.json as well as printed. TensorFlow loads only when something is
translated: a finished run started again prints its report without it (training/finished.py)."""
import json
import os
import shlex

from tfnmt import paths
from tfnmt.data.corpus import read_split
from tfnmt.inference import length_penalty

SAMPLES = 3
# A line "repeats itself" when it holds a sequence of this many words twice.
REPEAT_WORDS = 3


def repeating(lines, words=REPEAT_WORDS):
    """How many of `lines` hold a sequence of `words` whitespace-separated words twice."""
    count = 0
    for line in lines:
        tokens = line.split()
        sequences = [tuple(tokens[i:i + words]) for i in range(len(tokens) - words + 1)]
        count += len(sequences) != len(set(sequences))
    return count


def repeats_too_often(repeats, sentences):
    """Whether a report's translations repeat themselves well beyond their references (`repeats`:
    its "repeating" entry): more than twice as many, and more than 5% of the sentences."""
    return repeats["translations"] > max(2 * repeats["references"], sentences / 20)


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


class ServedTranslator:
    """The checkpoint export.py exports by default, translating as its SavedModel serves (a
    `TranslationModule`, beam search): the end of a run chooses the length penalty on dev
    from one search under the whole grid (`translate_alphas`) and reports on test with it
    through the same trace. The penalty of `translate` is a variable: one trace for any alpha.
    The checkpoint is loaded on first use.

    Args:
      model_dir: the run's model_dir.
      beam_size: the beam's width (as served).
      batch_size: sentences translated at once.
      no_repeat_ngram_size: N > 0: no translation repeats a sequence of N subwords.

    Example:
      translator = ServedTranslator("runs/de-en")
      translations = translator.translate(["Das ist ein Haus."], alpha=1.2)
    """

    def __init__(self, model_dir, beam_size=4, batch_size=64, no_repeat_ngram_size=0):
        self.model_dir, self.beam_size, self.batch_size = model_dir, beam_size, batch_size
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self._module = self._checkpoint = self._alpha = None
        self._grid_searches = {}

    def _load(self):
        """Loads the checkpoint and builds the module, once: on first use, so an end of run
        that translates nothing loads nothing."""
        if self._module is None:
            import tensorflow as tf

            from tfnmt.checkpoints import load_model
            from tfnmt.inference.serving import TranslationModule

            model, vocab, checkpoint = load_model(self.model_dir)
            self._checkpoint = os.path.relpath(checkpoint, self.model_dir)
            self._alpha = tf.Variable(length_penalty.PAPER_ALPHA, trainable=False,
                                      dtype=tf.float32)
            self._module = TranslationModule(model, vocab, self.beam_size, self._alpha,
                                             n_best=1,
                                             no_repeat_ngram_size=self.no_repeat_ngram_size)

    @property
    def module(self):
        """The `TranslationModule` that translates (loaded on first use)."""
        self._load()
        return self._module

    @property
    def checkpoint(self):
        """The checkpoint translated with, relative to the model_dir (loaded on first use)."""
        self._load()
        return self._checkpoint

    def translate(self, sentences, alpha):
        """Translations of `sentences` (a list of str) with length penalty `alpha`: by a grid
        search already traced that holds alpha (`translate_alphas`: the same translations, in
        about the same time, without tracing the module's `serve`), else by `serve`."""
        from tfnmt.inference.batching import translate_lines

        for alphas in self._grid_searches:
            if float(alpha) in alphas:
                return self.translate_alphas(sentences, alphas)[float(alpha)]
        self._load()
        self._alpha.assign(alpha)

        def translate(batch):
            out = self._module.serve(batch)
            return out["translations"], out["scores"]

        return translate_lines(translate, list(sentences), self.batch_size)

    def translate_alphas(self, sentences, alphas):
        """{alpha: translations of `sentences`} for each of `alphas`, from one beam search
        (`TranslationModule.translate_batch` with alphas): what `translate` gives under each,
        for about the time of one."""
        import tensorflow as tf

        from tfnmt.inference.batching import in_length_order

        self._load()
        alphas = tuple(float(alpha) for alpha in alphas)
        if alphas not in self._grid_searches:  # one trace per grid
            self._grid_searches[alphas] = tf.function(
                lambda batch: self._module.translate_batch(batch, 1, alphas=alphas)[0],
                input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        search = self._grid_searches[alphas]

        def texts(batch):  # [B, M]
            return [[text.decode("utf-8") for text in row]
                    for row in search(tf.constant(batch)).numpy()]

        rows = in_length_order(texts, list(sentences), self.batch_size)
        return {alpha: [row[m] for row in rows] for m, alpha in enumerate(alphas)}


def choose_length_penalty(translator, settings, grid=length_penalty.ALPHA_GRID,
                          bleu_tokenize="13a"):
    """Chooses the beam search's length penalty on the dev split
    (`length_penalty.choose_alpha`) and writes it to <model_dir>/decoding.json.

    Args:
      translator: the run's `ServedTranslator`.
      settings: the run's settings (its data section names the dev split).
      grid: the alphas to try, in increasing order.
      bleu_tokenize: the run's sacreBLEU tokenization (`evaluator.run_bleu_tokenization`).

    Returns:
      (alpha, {alpha: dev sacreBLEU}); (None, {}) when the dev split holds no pairs.
    """
    d = settings["data"]
    pairs = list(read_split(d, "dev"))
    if not pairs:
        return None, {}
    translations = translator.translate_alphas([s for s, _ in pairs], grid)
    best, scores = length_penalty.choose_alpha(translations.__getitem__, [t for _, t in pairs],
                                               grid, tokenize=bleu_tokenize)
    length_penalty.write_choice(translator.model_dir, best, translator.beam_size, scores,
                                translator.checkpoint, translator.no_repeat_ngram_size)
    return best, scores


def test_report(translator, settings, alpha=length_penalty.PAPER_ALPHA, bleu_tokenize="13a"):
    """Scores the test split as served.

    Args:
      translator: the run's `ServedTranslator`.
      settings: the run's settings (its data section names the test split).
      alpha: the beam search's length penalty.
      bleu_tokenize: the run's sacreBLEU tokenization (`evaluator.run_bleu_tokenization`).

    Returns:
      {"split", "sentences", "beam_size", "alpha", "no_repeat_ngram_size", "bleu", "chrf",
      their signatures, "samples", "checkpoint", "sources_cut": the sources longer than the
      model reads, "translations": the file in the model_dir that holds them, one per line
      (for `evaluate.py --baseline` to compare another model with), "repeating": how many
      translations and references repeat a sequence of REPEAT_WORDS words}; None when the
      dataset has no test split (--dataset=files without --test_files).
    """
    from tfnmt.inference.sacrebleu_scores import corpus_scores

    d = settings["data"]
    files = (d.get("files") or {}).get("test")
    if d["dataset"] == "files" and not files:
        return None
    pairs = list(read_split(d, "test"))
    if not pairs:
        return None
    sources = [s for s, _ in pairs]
    hypotheses = translator.translate(sources, alpha)
    lengths = translator.module.source_lengths(sources)
    report = {"split": "test", "sentences": len(pairs), "beam_size": translator.beam_size,
              "alpha": alpha, "no_repeat_ngram_size": translator.no_repeat_ngram_size,
              "checkpoint": translator.checkpoint,
              "sources_cut": int((lengths["subwords"] > lengths["max_subwords"]).numpy().sum())}
    report.update(corpus_scores(hypotheses, [t for _, t in pairs], signatures=True,
                                tokenize=bleu_tokenize))
    paths.write_atomically(os.path.join(translator.model_dir, paths.TEST_TRANSLATIONS),
                           "".join(f"{line}\n" for line in hypotheses))
    report["translations"] = paths.TEST_TRANSLATIONS
    report["repeating"] = {"words": REPEAT_WORDS, "translations": repeating(hypotheses),
                           "references": repeating(t for _, t in pairs)}
    report["samples"] = [{"source": pairs[i][0], "reference": pairs[i][1],
                          "translation": hypotheses[i]} for i in pick_samples(pairs)]
    return report


def next_commands(model_dir, reverse=False, example=None, own_data=False):
    """The commands that export, translate and evaluate the trained model.

    Args:
      model_dir: the run's directory.
      reverse: the run translates English to German (train.py --reverse), not German to
        English, as the default example sentence and file names assume.
      example: the sentence to translate (default: a German or English one).
      own_data: the run's languages are its data's, not German and English: the files to
        evaluate are named as sources and references.

    Returns:
      A list of shell commands.
    """
    # Commands to copy: a path with a blank stays one word.
    export_dir = shlex.quote(os.path.join(model_dir, paths.EXPORT))
    model_dir = shlex.quote(model_dir)
    sentence, source, reference = ("This is a house.", "en", "de") if reverse else \
        ("Das ist ein Haus.", "de", "en")
    if own_data:
        source, reference = "sources", "references"
    return [f"python export.py --model_dir={model_dir}",
            f"echo {shlex.quote(example or sentence)} | python translate.py "
            f"--export={export_dir}",
            f"python evaluate.py --model_dir={model_dir} --source=my.{source} "
            f"--reference=my.{reference}"]


def format_report(report, model_dir, reverse=False, own_data=False):
    """The end-of-run report as text.

    Args:
      report: `test_report`'s result, or None.
      model_dir: the run's directory.
      reverse: as for `next_commands`.
      own_data: the run trained on other data than the embedded corpus: the example sentence
        to translate is the shortest of the report's sample sources (in the run's source
        language), where there is a report.

    Returns:
      Lines: the test scores with their signatures and samples (when there is a report), then the
      next commands.
    """
    lines = []
    if report:
        rule = report.get("no_repeat_ngram_size")
        rule = f"no repeated {rule}-grams of subwords, " if rule else ""
        lines.append(f"test ({report['sentences']:,d} sentences, beam {report['beam_size']}, "
                     f"length penalty {report['alpha']:g}, {rule}{report['checkpoint']}): "
                     f"sacreBLEU {report['bleu']:.2f} | chrF {report['chrf']:.2f}")
        if report.get("sources_cut"):
            lines.append(f"  {report['sources_cut']:,d} of the sources are longer than the "
                         "model reads (max_length - 1 subwords): their translations cover "
                         "their start only")
        lines.append(f"  BLEU  {report['bleu_signature']}")
        lines.append(f"  chrF2 {report['chrf_signature']}")
        if report.get("translations"):
            lines.append(f"  translations in {os.path.join(model_dir, report['translations'])}"
                         " (evaluate.py --baseline compares another model's with them)")
        repeats = report.get("repeating")
        if repeats and not rule and repeats_too_often(repeats, report["sentences"]):
            lines.append(f"  {repeats['translations']:,} of them repeat a sequence of "
                         f"{repeats['words']} words ({repeats['references']:,} of the "
                         "references do): --no_repeat_ngram_size=4 forbids repeats; this command "
                         "with it reports again (no more training) and keeps it for export.py, "
                         "translate.py and evaluate.py (docs/serving.md, Repetitions)")
        for sample in report["samples"]:
            lines.append(f"  source       {sample['source']}")
            lines.append(f"  reference    {sample['reference']}")
            lines.append(f"  translation  {sample['translation']}")
    example = min((sample["source"] for sample in report["samples"]), key=len) \
        if own_data and report and report["samples"] else None
    lines.append("next:")
    lines.extend(f"  {command}"
                 for command in next_commands(model_dir, reverse, example, own_data))
    return "\n".join(lines)


def write_report(model_dir, report):
    """Writes <model_dir>/report.json atomically.

    Args:
      model_dir: the run's directory.
      report: a JSON-able dict.
    """
    paths.write_atomically(os.path.join(model_dir, paths.REPORT),
                           json.dumps(report, indent=1, ensure_ascii=False))
