"""Score translations with sacreBLEU: BLEU, chrF and TER, each with its signature.

What is translated: a split of the model's dataset (--split, the default: test), or your own
line-aligned files (--source and --reference; repeat --reference for several references per
sentence). Who translates: a training directory's checkpoint (--model_dir, beam search), a
SavedModel export (--export, its own settings) or a CTranslate2 model (--export, CTranslate2's
beam search with --beam_size and --alpha); or nobody, with --hypotheses naming translations made
elsewhere (scored against --reference, or without it against the --split of --model_dir).

  python evaluate.py                                                # test split, beam 4
  python evaluate.py --model_dir=runs/de-en --split=dev --output=dev.hyp
  python evaluate.py --export=runs/de-en/export --source=news.de --reference=news.en
  python evaluate.py --hypotheses=news.hyp --reference=news.en      # score existing output
  python evaluate.py --hypotheses=news.hyp --reference=news.en --reference=news.2.en
  python evaluate.py --hypotheses=new.hyp --baseline=old.hyp --reference=news.en
  python evaluate.py --hypotheses=ct2.hyp --baseline=runs/de-en/test.hyp  # on the test split
  python evaluate.py --export=runs/de-en/ctranslate2-int8 --baseline=runs/de-en/test.hyp

With --baseline (another system's translations of the same sentences) it also scores those and
tests each metric's difference: a 95% confidence interval by paired bootstrap resampling (1,000
resamples) and a p-value by paired approximate randomization (10,000 trials), on sacreBLEU's
sufficient statistics.
"""
import json
import os
import shlex
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags, logging  # noqa: E402

from tfnmt import cli, text_lines  # noqa: E402
from tfnmt.inference import bleu_tokenization  # noqa: E402
from tfnmt.paths import (DEFAULT_MODEL_DIR, SETTINGS, is_ctranslate2, is_export,  # noqa: E402
                         other_kind, read_settings)

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", DEFAULT_MODEL_DIR, "Training directory: its checkpoints "
                    "translate (unless --export), its settings.json names the dataset of --split "
                    "(with --export: by default the directory the export lies in).")
flags.DEFINE_string("export", None, "Translate with this SavedModel (version dir or export_dir), "
                    "or CTranslate2 model (export.py --format=ctranslate2), not a checkpoint.")
flags.DEFINE_string("checkpoint", "auto", "auto (averaged at the newest update, else best, else "
                    "latest) | latest | averaged | best | a checkpoint path or directory, or a "
                    "checkpoint in the model_dir (ckpt-2000, best/ckpt-2000).")
flags.DEFINE_enum("split", "test", ["dev", "test"], "Split of the model's dataset to score "
                  "(not with --reference, which gives your own sentences).")
flags.DEFINE_string("source", None, "Source sentences, one per line (with --reference).")
flags.DEFINE_multi_string("reference", None, "Reference translations, line-aligned with "
                          "--source or --hypotheses; repeat it for several references per "
                          "sentence.")
flags.DEFINE_string("hypotheses", None, "Score these translations (one per line), translating "
                    "nothing: against --reference, else against the --split of --model_dir.")
flags.DEFINE_string("baseline", None, "Another system's translations of the same sentences, "
                    "one per line: also scored, and each difference tested (95% interval, "
                    "p-value).")
flags.DEFINE_integer("beam_size", 4, "Beam size (checkpoints and CTranslate2 models).")
flags.DEFINE_float("alpha", None, "Length penalty exponent (checkpoints: default the one "
                   "train.py chose on dev, <model_dir>/decoding.json, else 0.6; CTranslate2 "
                   "models: its length_penalty, default the one export.py kept, else 1).")
cli.define_beam_stop_flag("Checkpoints only: ")
cli.define_no_repeat_flag("Checkpoints and CTranslate2 models: ")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
flags.DEFINE_string("output", None, "Also write the translations here, one per line ('-': "
                    "stdout, before the scores; .gz: compressed).")
flags.DEFINE_enum("bleu_tokenize", bleu_tokenization.AUTO, bleu_tokenization.CHOICES,
                  "sacreBLEU tokenization of BLEU: auto (default) takes the training run's "
                  "--bleu_tokenize, else picks by the references' script (zh for Chinese, char "
                  "for Japanese, Thai and others written without spaces, else 13a).")
flags.DEFINE_bool("json", False, "Print one JSON line instead of text.")
METRICS = (("bleu", "BLEU"), ("chrf", "chrF2"), ("ter", "TER"))  # printed in this order
flags.register_validator("batch_size", lambda v: v > 0, "--batch_size must be positive")
flags.register_validator("beam_size", lambda v: v > 0, "--beam_size must be positive")
cli.register_alpha_validator()


def _read_lines(path, flag):
    try:
        lines = text_lines.read_lines(path)
    except UnicodeDecodeError as error:
        raise app.UsageError(f"--{flag}={path}: not UTF-8 text ({error.reason} at byte "
                             f"{error.start})")
    except OSError as error:
        raise app.UsageError(f"--{flag}={path}: {error.strerror}")
    _refuse_pairs(lines, flag, path)
    return lines


def _refuse_pairs(lines, flag, path, sample=1000):
    """One line (app.UsageError) for a TSV of pairs given as a file of sentences
    (`text_lines.tabbed_pairs`: its lines would be translated and scored tab and all), with
    the `cut` commands that give its columns as files."""
    if not (tabbed := text_lines.tabbed_pairs(lines[:sample])):
        return
    if flag == "source":
        cuts, (source, reference) = text_lines.column_cuts(path, [1, 2])
        advice = (f"{cuts}; then --source={shlex.quote(source)} "
                  f"--reference={shlex.quote(reference)}")
    else:
        cuts, (column,) = text_lines.column_cuts(path, [2])
        advice = f"{cuts} (the column that holds them); then --{flag}={shlex.quote(column)}"
    raise app.UsageError(f"--{flag}={path}: {tabbed} evaluate.py reads a sentence per line: "
                         f"{advice}")


def _training_dir_of(export):
    """The training directory an export lies in (export.py writes <model_dir>/export/<version>),
    or None."""
    path = os.path.abspath(export)
    for _ in range(2):
        path = os.path.dirname(path)
        if os.path.exists(os.path.join(path, SETTINGS)):
            return path
    return None


def _training_dir():
    """The training directory of the model that translates: --model_dir, or with --export and
    no --model_dir, the one the export lies in (not the default runs/de-en, which may hold
    another model), or None."""
    if not FLAGS.export or FLAGS["model_dir"].present:
        return FLAGS.model_dir
    return _training_dir_of(FLAGS.export)


def _split_model_dir():
    """The training directory whose settings name the --split's data (`_training_dir`)."""
    found = _training_dir()
    if found is None:
        raise app.UsageError(
            f"--export={FLAGS.export} lies in no training directory, whose settings.json names "
            "the data of --split: give that directory as --model_dir, or give --source and "
            "--reference")
    return found


def _split_data(model_dir, split):
    """The data settings of model_dir, checked to name a --split (before TensorFlow loads)."""
    own = "--reference" if FLAGS.hypotheses else "--source and --reference"
    settings = read_settings(model_dir)
    if settings is None:
        if is_export(model_dir) or is_ctranslate2(model_dir):
            kind = "a SavedModel export" if is_export(model_dir) else "a CTranslate2 model"
            advice = f"it is {kind}: give it as --export, with {own}"
        elif FLAGS.export:  # the split is of the training data that model_dir names
            advice = ("--export scores the --split of the data its training directory names: "
                      "give that directory as --model_dir, or give --source and --reference")
        else:
            advice = other_kind(model_dir) or f"give --model_dir, or {own}"
        raise app.UsageError(f"{model_dir} holds no trained model (no {SETTINGS}); {advice}")
    data = settings.get("data") or {}
    if not data.get("dataset"):
        raise app.UsageError(f"{os.path.join(model_dir, SETTINGS)} names no dataset (its "
                             f"data.dataset): give {own}")
    files = (data.get("files") or {}).get(split)
    if data["dataset"] == "files" and not files:  # read_split would name train.py's flag
        raise app.UsageError(f"{model_dir} was trained on its own files with no {split} split "
                             f"(train.py --{split}_files): give {own}")
    return data


def _split_pairs(data, split):
    from tfnmt.data.corpus import CorpusError, read_split

    files = (data.get("files") or {}).get(split)
    try:
        pairs = list(read_split(data, split))
    except (CorpusError, OSError) as error:
        raise app.UsageError(str(error))
    if not pairs:
        raise app.UsageError(f"the {split} split of {data['dataset']}"
                             f"{f' ({files})' if files else ''} holds no sentence pairs to score")
    return [s for s, _ in pairs], [t for _, t in pairs], f"{split} split"


def _aligned(lines, references, flags_named):
    if len(lines) != len(references):
        raise app.UsageError(f"{flags_named} have {len(lines):,} and {len(references):,} "
                             "lines: they must be line-aligned")
    if not references:
        raise app.UsageError(f"{flags_named} are empty: nothing to score")
    from tfnmt.data.alignment import describe, first_out_of_step

    if found := first_out_of_step(zip(lines, references)):
        sides = tuple(flag.split("=")[0] for flag in flags_named.split(" and "))
        raise app.UsageError(f"{flags_named}: {describe(found, sides)}")


def _read_references(lines, flag):
    """Each --reference file's lines (a list per file), each aligned with --<flag>'s `lines`."""
    references = []
    for path in FLAGS.reference:
        named = "--reference" if len(FLAGS.reference) == 1 else f"--reference={path}"
        references.append(_read_lines(path, "reference"))
        _aligned(lines, references[-1], f"--{flag} and {named}")
    return references


def _bleu_tokenization(references):
    """--bleu_tokenize; for auto, the one the training run whose model translates (or whose
    split is scored) chose (train.py --bleu_tokenize), else the one that fits the references'
    script."""
    chosen = FLAGS.bleu_tokenize
    if chosen == bleu_tokenization.AUTO and not (FLAGS.hypotheses and FLAGS.reference):
        model_dir = _training_dir()
        try:
            saved = read_settings(model_dir) if model_dir else None
        except OSError:  # not a directory: translating says so
            saved = None
        chosen = ((saved or {}).get("train") or {}).get("bleu_tokenize",
                                                        bleu_tokenization.AUTO)
    try:
        bleu_tokenization.check_available(chosen)
    except ValueError as error:
        raise app.UsageError(str(error))
    return bleu_tokenization.resolve(chosen, [line for stream in references
                                              for line in stream])[0]


def _scored_name(path, flag):
    """What the scores are printed as being of: a file's name; standard input or a pipe
    (`<(zcat news.hyp.gz)`, /dev/fd/63) by its flag."""
    if path == "-":
        return f"--{flag} (standard input)"
    if not os.path.isfile(path):
        return f"--{flag} ({path})"
    return os.path.basename(path)


def _translate(sources, unit):
    from tfnmt.inference import loading
    from tfnmt.inference.batching import translate_lines

    try:
        signatures = loading.load_signatures(FLAGS.model_dir, FLAGS.export, FLAGS.beam_size,
                                             FLAGS.alpha, FLAGS.checkpoint,
                                             beam_stop=FLAGS.beam_stop,
                                             no_repeat_ngram_size=FLAGS.no_repeat_ngram_size)
    except loading.load_errors(FLAGS.export) as error:
        raise app.UsageError(str(error))
    if message := loading.long_sources(signatures, sources, unit=unit):
        print(f"evaluate.py: of the {len(sources):,} sources, {message}", file=sys.stderr)
    return translate_lines(signatures["serving_default"], sources, FLAGS.batch_size)


def _say_other_languages(sources, references, sample=1000):
    """A line on stderr for --source written in the model's target language, and for each
    --reference written in its source language (`loading.other_language`)."""
    from tfnmt.inference import loading

    given = [(sources, f"--source {FLAGS.source}", "source")] + [
        (lines, f"--reference {path}", "target")
        for lines, path in zip(references, FLAGS.reference)]
    for texts, name, side in given:
        if message := loading.other_language(None if FLAGS.export else FLAGS.model_dir,
                                             FLAGS.export, texts[:sample], name, side):
            print(f"evaluate.py: {message}", file=sys.stderr)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.source and not FLAGS.reference:
        raise app.UsageError("--source needs --reference")
    if FLAGS.source and FLAGS.hypotheses:
        raise app.UsageError("give --source (to translate) or --hypotheses (translated), "
                             "not both")
    if FLAGS.reference and not (FLAGS.source or FLAGS.hypotheses):
        raise app.UsageError("--reference needs --source (to translate) or --hypotheses")
    if FLAGS.hypotheses and FLAGS.output:
        raise app.UsageError("--output writes translations, and --hypotheses translates nothing")
    # One stream: the first reader would take it all, and the next would read no lines.
    from_stdin = [f"--{flag}" for flag in ("source", "hypotheses", "baseline")
                  if FLAGS[flag].value == "-"] + ["--reference" for path in FLAGS.reference or ()
                                                  if path == "-"]
    if len(from_stdin) > 1:
        raise app.UsageError(f"{' and '.join(from_stdin)} "
                             f"{'both' if len(from_stdin) == 2 else 'all'} read standard input "
                             "('-'): give all but one as files")
    if FLAGS.hypotheses:  # what would translate: left unused, so refused
        for name in ("export", "checkpoint", "beam_size", "alpha", "beam_stop",
                     "no_repeat_ngram_size", "batch_size"):
            if FLAGS[name].present:
                raise app.UsageError(f"--{name} is for translating, and --hypotheses scores "
                                     f"translations made elsewhere: drop --{name}")
        if FLAGS.reference and FLAGS["model_dir"].present:
            raise app.UsageError("--hypotheses is scored against --reference, or without it "
                                 "against the --split of --model_dir: drop one of --reference "
                                 "and --model_dir")
    if FLAGS.export and FLAGS.source and FLAGS["model_dir"].present:
        raise app.UsageError("give one of --model_dir and --export to translate --source (with "
                             "--export, --model_dir only names the data of --split)")
    if FLAGS["split"].present and FLAGS.reference:
        raise app.UsageError("--split scores the model's dataset, and --reference gives your "
                             "own sentences: drop --split")
    if FLAGS.export:
        cli.refuse_checkpoint_search_flags(FLAGS.export)
    if FLAGS.output:  # written after translating: refused before, not after that work
        cli.check_output_path(FLAGS.output, [("source", FLAGS.source),
                                             ("baseline", FLAGS.baseline)]
                              + [("reference", path) for path in FLAGS.reference or ()])
    from_split = not FLAGS.reference  # the references (and sources) of the model's dataset
    if from_split:  # checked here; read below, once TensorFlow's threads are set
        split_dir = _split_model_dir()
        split_data = _split_data(split_dir, FLAGS.split)
    if FLAGS.hypotheses or FLAGS.source:
        flag = "hypotheses" if FLAGS.hypotheses else "source"
        lines = _read_lines(FLAGS[flag].value, flag)
        what = _scored_name(FLAGS[flag].value, flag)
        if not from_split:
            references = _read_references(lines, flag)
    baseline = _read_lines(FLAGS.baseline, "baseline") if FLAGS.baseline else None
    if baseline is not None and not from_split:  # a split's count is known once it is read
        _aligned(baseline, references[0], "--baseline and --reference")
    if not FLAGS.hypotheses:  # before reading a split, which runs TensorFlow for TFDS's
        cli.check_model_path(FLAGS.model_dir, FLAGS.export)
        from tfnmt.inference.loading import share_threads, skip_graph_rewrites

        share_threads(FLAGS.export)
        skip_graph_rewrites(FLAGS.export)
    if FLAGS.source:
        _say_other_languages(lines, references)
    if from_split:
        split_sources, split_references, split_name = _split_pairs(split_data, FLAGS.split)
        references = [split_references]
        if FLAGS.hypotheses:
            _aligned(lines, split_references, f"--hypotheses and --split={FLAGS.split}")
            what = f"{what}, against the {split_name} of {split_dir}"
        else:
            lines, what = split_sources, split_name
        if baseline is not None:
            _aligned(baseline, split_references, f"--baseline and --split={FLAGS.split}")
    bleu_tokenize = _bleu_tokenization(references)  # refused before translating
    # Else lines are sources: a file's lines, or a split's sentences.
    hypotheses = lines if FLAGS.hypotheses else _translate(
        lines, "line" if FLAGS.source else "sentence")
    from tfnmt.inference.sacrebleu_scores import corpus_scores, sacrebleu_metrics

    if FLAGS.output:
        output = text_lines.LineWriter(FLAGS.output)
        output.write(hypotheses)
        output.close()
    compared = None
    if baseline is None:
        scores = corpus_scores(hypotheses, references[0], ter=True, signatures=True,
                               more_references=references[1:], tokenize=bleu_tokenize)
    else:
        from tfnmt.inference import significance

        # The comparison scores both systems from their per-sentence statistics: the
        # system's own scores are among its results (TER's statistics take seconds).
        metrics = sacrebleu_metrics(bleu_tokenize, ter=True)
        compared = significance.compare(baseline, hypotheses, references, metrics)
        scores = {}
        for name, metric in metrics.items():  # in corpus_scores' order
            scores[name] = compared[name]["system"]
            scores[f"{name}_signature"] = str(metric.get_signature())
    if FLAGS.json:
        result = dict(scores, sentences=len(hypotheses), references=len(references),
                      scored=what)
        if compared:
            result["baseline"] = {"file": FLAGS.baseline, "trials": significance.TRIALS,
                                  "resamples": significance.RESAMPLES, "seed": significance.SEED}
            for name, test in compared.items():
                result["baseline"][name] = dict(test, verdict=significance.verdict(name, test))
        print(json.dumps(result))
        return
    print(f"{what}: {len(hypotheses):,} sentence{'' if len(hypotheses) == 1 else 's'}"
          + (f", {len(references)} references each" if len(references) > 1 else ""))
    for name, label in METRICS:
        print(f"  {label:6s} {scores[name]:6.2f}  {scores[f'{name}_signature']}")
    if compared:
        _print_comparison(compared)


def _print_comparison(compared):
    """The baseline's scores, each difference with its 95% interval, p and verdict."""
    from tfnmt.inference import significance

    print(f"against --baseline {FLAGS.baseline}: its score, the difference (95% interval by "
          f"paired bootstrap, {significance.RESAMPLES:,} resamples), p (paired approximate "
          f"randomization, {significance.TRIALS:,} trials)")
    for name, label in METRICS:
        test = compared[name]
        low, high = test["interval"]
        lower = " (lower is better)" if name in significance.LOWER_IS_BETTER else ""
        print(f"  {label:6s} {test['baseline']:6.2f}  {test['difference']:+6.2f} "
              f"[{low:+.2f}, {high:+.2f}]  p {test['p']:.4f}  "
              f"{significance.verdict(name, test)}{lower}")


def run():
    """The `evaluate.py` / `tfnmt-evaluate` command."""
    logging.set_verbosity(logging.WARNING)
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
