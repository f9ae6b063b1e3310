r"""Train a Transformer translation model (tfnmt).

With no flags: the `cpu` preset on the embedded German->English corpus for 12.25 minutes of
training (as many updates as this CPU does in them), then dev scores, the length penalty chosen
on dev and a report on the test split (beam 4: sacreBLEU, chrF, sample translations, the
commands to export and translate).
Re-running the same command resumes from the newest checkpoint in --model_dir. Flags not given
on the command line take the values saved in <model_dir>/settings.json (a time-budgeted run
saves the number of updates it planned). A resumed run may change only --train_steps,
--train_minutes, --log_every, --eval_every, --bleu_sentences, --eval_beam_size, --best_metric,
--bleu_tokenize, --early_stopping, --clip_norm, --checkpoint_every, --keep_checkpoints,
--average_last, --jit_compile, --mixed_precision (not to or from fp16), --data_dir and
--tfds_data_dir; any other change is refused in one line. It may run on another number of
replicas (--batch_tokens is per replica: the log names the global batch's change).

Fine-tuning: --init_from starts a new --model_dir from a trained model (its model and
vocabulary; the new data is tokenized with it), with a fresh optimizer unless --init_optimizer.

  python train.py
  python train.py --model_dir=runs/base --preset=base --train_steps=100000 --batch_tokens=25000
  python train.py --model_dir=runs/medical --init_from=runs/de-en --dataset=files \
    --train_files=med.de,med.en --dev_files=med-dev.de,med-dev.en --train_steps=400
  python train.py --flagfile=my.flags
"""
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags, logging  # noqa: E402

from tfnmt import cli  # noqa: E402

from tfnmt.inference import bleu_tokenization  # noqa: E402
from tfnmt.inference.length_penalty import ALPHA_GRID, default_no_repeat  # noqa: E402
from tfnmt.model.presets import PRESETS  # noqa: E402
from tfnmt.paths import DEFAULT_MODEL_DIR, REPORT, SETTINGS, cannot_write_in  # noqa: E402
from tfnmt.programs import train_data_checks as data_checks  # noqa: E402

FLAGS = flags.FLAGS
# Where and what.
flags.DEFINE_string("model_dir", DEFAULT_MODEL_DIR, "Directory for checkpoints, settings, "
                    "vocabulary and TensorBoard logs; rerunning resumes from it.")
flags.DEFINE_string("dataset", "embedded", "'embedded' (tfnmt/data/de-en, the default), 'files' "
                    "(your own, with --train_files etc.; the default when they are given), or a "
                    "TFDS translation dataset name such as wmt14_translate/de-en.")
flags.DEFINE_multi_string("train_files", None, "With --dataset=files: a TSV (source<TAB>target) "
                          "or 'source.txt,target.txt' of line-aligned files; .gz is read too. "
                          "Repeat the flag for several corpora (see --train_weights).")
flags.DEFINE_list("train_weights", None, "With several --train_files: how often each corpus is "
                  "sampled, e.g. 3,1 (default: in proportion to their sizes).")
flags.DEFINE_float("filter_length_ratio", 0.0, "Drop training pairs whose longer side has more "
                   "than this many times the subwords of the shorter (default 0: off).")
flags.DEFINE_bool("filter_duplicates", False, "Drop training pairs seen before (same source and "
                  "target, in any corpus).")
flags.DEFINE_bool("filter_identical", False, "Drop training pairs whose source is their target.")
flags.DEFINE_string("dev_files", None, "With --dataset=files: the dev set, as --train_files.")
flags.DEFINE_string("test_files", None, "With --dataset=files: the test set, as --train_files.")
flags.DEFINE_string("tfds_data_dir", None, "TFDS data directory (default ~/tensorflow_datasets).")
flags.DEFINE_bool("reverse", False, "Translate the other way: the second side of each pair is "
                  "the source (English->German from the embedded corpus or "
                  "wmt14_translate/de-en). Default false.")
flags.DEFINE_string("data_dir", None, "Where the vocabulary and TFRecords are prepared "
                    "(default <model_dir>/data); runs on the same data may share it.")
flags.DEFINE_integer("vocab_size", 8000, "SentencePiece vocabulary size (~32000 for WMT); with "
                     "--separate_vocabularies, each side's.")
flags.DEFINE_bool("separate_vocabularies", False, "One SentencePiece model per side, learned on "
                  "its own text, and separate source/target embeddings (default false: one "
                  "shared vocabulary and embedding, as the paper).")
flags.DEFINE_enum("vocab_type", "unigram", ["unigram", "bpe"], "SentencePiece model type.")
flags.DEFINE_list("vocab", None, "Tokenize with this SentencePiece model instead of learning one "
                  "(source.model,target.model: one per side, the source's first, which with "
                  "--reverse is the second side's); it must reserve ids 0-3 for PAD, UNK, BOS, "
                  "EOS as tfnmt's do. Default: learned on the training data.")
flags.DEFINE_integer("max_length", 256, "Longest pair kept, in subwords (incl. BOS/EOS); "
                     "longer training and dev pairs are left out (counted in the log).")
# Model.
flags.DEFINE_enum("preset", "cpu", list(PRESETS), "Model size and its training defaults "
                  "(tfnmt/model/presets.py).")
flags.DEFINE_integer("num_layers", None, "Override: encoder and decoder layers.")
flags.DEFINE_integer("d_model", None, "Override: model width.")
flags.DEFINE_integer("num_heads", None, "Override: attention heads.")
flags.DEFINE_integer("d_ff", None, "Override: feed-forward inner width.")
flags.DEFINE_float("dropout", None, "Override: residual/embedding dropout.")
flags.DEFINE_float("dropout_from_epoch", None, "Residual/embedding dropout starts once the run has "
                   "trained on this many epochs of its training data (0: from the start; "
                   "default: the preset's: 7.5 for cpu, else 0).")
flags.DEFINE_float("attention_dropout", None, "Override: dropout on attention weights.")
flags.DEFINE_float("ffn_dropout", None, "Override: dropout inside the feed-forward block "
                   "(default 0).")
flags.DEFINE_enum("activation", None, ["relu", "gelu"], "Override: feed-forward activation "
                  "(default relu, as the paper).")
flags.DEFINE_integer("num_encoder_layers", None, "Override: encoder depth (default "
                     "--num_layers).")
flags.DEFINE_integer("num_decoder_layers", None, "Override: decoder depth (default "
                     "--num_layers).")
flags.DEFINE_bool("tie_output", None, "Override: the target embedding also projects to the "
                  "softmax (default true); false gives the model its own output layer.")
flags.DEFINE_bool("norm_first", None, "Override: pre-norm layers instead of the paper's post-norm.")
flags.DEFINE_enum("position", None, ["sinusoidal", "learned"], "Override: position encoding.")
flags.DEFINE_bool("share_embeddings", None, "Override: one embedding matrix for source, target "
                  "and output (default true); false gives source and target their own.")
# Optimisation.
flags.DEFINE_integer("batch_tokens", None, "Token budget per replica and micro-batch: "
                     "batch size x padded length of the longer side (default: the preset's).")
flags.DEFINE_integer("accum_steps", 1, "Micro-batches accumulated per update (the paper's "
                     "~25k-token batches on fewer devices).")
flags.DEFINE_integer("train_steps", None, "Total optimizer updates; a resumed run stops here "
                     "(default: the preset's, or what --train_minutes plans).")
flags.DEFINE_float("train_minutes", None, "Train for about this many minutes (dev evaluations "
                   "not counted), planning the number of updates from their pace (default: the "
                   "preset's: 12.25 for cpu, else 0 = --train_steps).")
flags.DEFINE_integer("warmup_steps", None, "Noam warm-up steps (default: the preset's; "
                     "paper: 4000 with 25k-token batches).")
flags.DEFINE_float("lr_scale", None, "Multiplier of the Noam learning rate (default: the "
                   "preset's).")
flags.DEFINE_enum("lr_decay", None, ["rsqrt", "linear"], "After warm-up: rsqrt (the paper's "
                  "1/sqrt(step)) or linear (to zero at --train_steps); default: the preset's.")
flags.DEFINE_float("label_smoothing", None, "Label smoothing epsilon of the loss (default: the "
                   "preset's: 0 for cpu, the paper's 0.1 for the others).")
flags.DEFINE_float("clip_norm", 0.0, "Scale each update's gradients down to this global norm "
                   "when larger (default 0: no clipping; the paper does not clip).")
flags.DEFINE_enum("strategy", "auto", ["auto", "one_device", "mirrored", "multi_worker"],
                  "tf.distribute strategy; auto (default): multi_worker where TF_CONFIG names "
                  "several workers, mirrored with several GPUs, else one device.")
flags.DEFINE_integer("cpu_devices", 1, "Split the CPU into this many logical devices, one "
                     "replica each with --strategy=mirrored (default 1).")
flags.DEFINE_enum("mixed_precision", "auto", ["auto", "none", "bf16", "fp16"],
                  "Compute dtype of matmuls (weights, softmax, LayerNorm and loss stay "
                  "float32): auto = bf16 on GPUs of compute capability >= 8.0 and on CPUs "
                  "whose native bf16 products time faster than float32's, else none (float32); "
                  "fp16 uses dynamic loss scaling.")
flags.DEFINE_bool("shape_stable", True, "Pad each batch to its length bucket's upper edge, so "
                  "every bucket has one shape (kernels are set up once per bucket, and memory "
                  "stays flat); false pads to the batch's longest pair.")
flags.DEFINE_float("bucket_growth", 1.1, "Length buckets: each this much wider than the last "
                   "(default 1.1); 1.0: one per length from 8 tokens on (fuller batches, more "
                   "batch shapes; bench/README.md compares them).")
flags.DEFINE_float("subword_alpha", 0.0, "Subword regularization: each read of a training pair "
                   "samples a new SentencePiece segmentation of both sides with this smoothing "
                   "(unigram; BPE: merge-dropout rate, below 1). Default 0: the best "
                   "segmentation.")
flags.DEFINE_integer("subword_nbest", 64, "With --subword_alpha: sample among this many best "
                     "segmentations (-1: all). Default 64.")
flags.DEFINE_bool("jit_compile", False, "XLA-compile each replica's forward and backward passes "
                  "(default false: slower on the CPUs of bench/README.md).")
flags.DEFINE_bool("plain_ops", False, "Stock TensorFlow ops instead of tfnmt's hand-written "
                  "fast ones (tfnmt/fast_ops.py): slower, same results up to rounding.")
flags.DEFINE_integer("seed", 1234, "Seed for initialisation and data order.")
flags.DEFINE_string("init_from", None, "Start a new --model_dir from this trained model_dir "
                    "(its best weights: averaged, else best, else newest) or checkpoint prefix, "
                    "with its model and vocabulary: fine-tuning on new data.")
flags.DEFINE_bool("init_optimizer", False, "With --init_from: also continue its optimizer "
                  "(Adam moments and step, so the schedule goes on; --train_steps must exceed "
                  "its step). Default false: a fresh optimizer and schedule.")
# Bookkeeping.
flags.DEFINE_integer("log_every", 50, "Steps between progress lines and train summaries.")
flags.DEFINE_integer("eval_every", None, "Steps between dev evaluations (0: only at the end; "
                     "default: the preset's).")
flags.DEFINE_integer("bleu_sentences", 0, "Dev sentences translated for BLEU (0: all).")
flags.DEFINE_integer("eval_beam_size", 1, "Dev translations: 1 = greedy (default), else beam "
                     "search of this width (as served; slower).")
flags.DEFINE_enum("best_metric", "bleu", ["bleu", "chrf", "loss"], "Dev metric that chooses "
                  "the best checkpoint, kept in <model_dir>/best (export.py --checkpoint=best).")
flags.DEFINE_enum("bleu_tokenize", bleu_tokenization.AUTO, bleu_tokenization.CHOICES,
                  "sacreBLEU tokenization of dev and test BLEU: auto (default) picks by the dev "
                  "references' script: zh for Chinese, char for Japanese, Thai and others "
                  "written without spaces, else 13a.")
flags.DEFINE_integer("early_stopping", 0, "Stop after this many dev evaluations in a row "
                     "without a better --best_metric (default 0: never; needs --eval_every).")
flags.DEFINE_integer("checkpoint_every", 100, "Steps between checkpoints.")
flags.DEFINE_integer("keep_checkpoints", 5, "Checkpoints kept.")
flags.DEFINE_bool("test_report", True, "At the end, translate the test split with beam 4 (as "
                  "export.py serves) and print test sacreBLEU/chrF and sample translations.")
flags.DEFINE_string("alpha", "auto", "Length penalty of beam search for this model_dir (the test "
                    "report; export.py, translate.py, evaluate.py): auto (default) chooses it on "
                    f"dev at the end among {', '.join(map(str, ALPHA_GRID))}; a number fixes "
                    "it.")
cli.define_no_repeat_flag(training=True)
flags.DEFINE_integer("average_last", 0, "Average the last N checkpoints at the end (paper: 5 "
                     "for base, 20 for big, near convergence; at most --keep_checkpoints; 0 or "
                     "1: no averaging). Off for the short default run: averaging a "
                     "still-improving model lowers its BLEU.")

MODEL_FLAGS = ("num_layers", "d_model", "num_heads", "d_ff", "dropout", "attention_dropout",
               "ffn_dropout", "activation", "num_encoder_layers", "num_decoder_layers",
               "norm_first", "position", "share_embeddings", "tie_output")
DATA_FLAGS = ("dataset", "tfds_data_dir", "data_dir", "reverse", "vocab", "vocab_size",
              "vocab_type", "separate_vocabularies", "max_length", "filter_length_ratio",
              "filter_duplicates", "filter_identical")
TRAIN_FLAGS = ("batch_tokens", "accum_steps", "train_steps", "train_minutes", "warmup_steps",
               "lr_scale",
               "lr_decay", "label_smoothing", "dropout_from_epoch", "clip_norm",
               "mixed_precision", "shape_stable",
               "bucket_growth", "subword_alpha", "subword_nbest", "jit_compile", "seed",
               "log_every", "eval_every",
               "bleu_sentences", "eval_beam_size", "best_metric", "bleu_tokenize",
               "early_stopping", "checkpoint_every", "keep_checkpoints", "average_last")

POSITIVE = ("max_length", "batch_tokens", "accum_steps", "train_steps",
            "warmup_steps", "log_every", "checkpoint_every", "keep_checkpoints", "cpu_devices",
            "eval_beam_size")
for _name in POSITIVE:
    flags.register_validator(_name, lambda v: v is None or v > 0, f"--{_name} must be positive")
flags.register_validator("vocab_size", lambda v: v >= 5,  # SentencePiece: a traceback below
                         "--vocab_size must be at least 5 (ids 0-3 are PAD, UNK, BOS and EOS)")
for _name in ("eval_every", "bleu_sentences", "average_last", "early_stopping"):
    flags.register_validator(_name, lambda v: v is None or v >= 0, f"--{_name} must be >= 0")
flags.register_validator("alpha", lambda v: _valid_alpha(v),  # defined below
                         "--alpha: give auto or a finite number >= 0")
flags.register_validator("label_smoothing", lambda v: v is None or 0.0 <= v < 1.0,
                         "--label_smoothing must be in [0, 1)")
flags.register_validator("clip_norm", lambda v: v >= 0.0, "--clip_norm must be >= 0")
flags.register_validator("seed", lambda v: 0 <= v < 2**32,  # what Keras' seeding takes
                         "--seed must be in [0, 2**32)")
flags.register_validator("dropout_from_epoch", lambda v: v is None or v >= 0.0,
                         "--dropout_from_epoch must be >= 0")
flags.register_validator("train_minutes", lambda v: v is None or 0.0 <= v < math.inf,
                         "--train_minutes must be >= 0 and finite")
flags.register_validator("filter_length_ratio", lambda v: v == 0.0 or v >= 1.0,
                         "--filter_length_ratio must be 0 (off) or >= 1")
flags.register_validator("lr_scale", lambda v: v is None or 0.0 < v < math.inf,
                         "--lr_scale must be positive and finite")
flags.register_validator("subword_alpha", lambda v: v >= 0.0, "--subword_alpha must be >= 0")
flags.register_validator("subword_nbest", lambda v: v == -1 or v > 0,
                         "--subword_nbest must be positive or -1")
flags.register_validator("bucket_growth", lambda v: 1.0 <= v < math.inf,
                         "--bucket_growth must be >= 1.0 and finite")
for _name in ("dropout", "attention_dropout", "ffn_dropout"):
    flags.register_validator(_name, lambda v: v is None or 0.0 <= v < 1.0,
                             f"--{_name} must be in [0, 1)")
for _name in ("num_layers", "num_encoder_layers", "num_decoder_layers", "d_model", "num_heads",
              "d_ff"):
    flags.register_validator(_name, lambda v: v is None or v > 0, f"--{_name} must be positive")


def _valid_alpha(text):
    from tfnmt.inference.length_penalty import parse_alpha

    try:
        parse_alpha(text)
        return True
    except ValueError:
        return False


def requested_settings(preset=None):
    """Settings from the flags (training defaults from `preset`, default --preset), and the
    set of those given explicitly."""
    from tfnmt.model.presets import get_preset, get_training

    preset = preset if preset and not FLAGS["preset"].present else FLAGS.preset
    model = get_preset(preset, **{k: FLAGS[k].value for k in MODEL_FLAGS})
    separate = FLAGS.separate_vocabularies or len(FLAGS.vocab or ()) == 2  # two models given
    if separate:  # two vocabularies cannot share one embedding
        model["share_embeddings"] = False
    training = get_training(preset)
    model["max_length"] = FLAGS.max_length
    settings = {
        "model_dir": FLAGS.model_dir,
        "preset": preset,
        "model": model,
        "data": {k: FLAGS[k].value for k in DATA_FLAGS},
        "train": {k: training[k] if FLAGS[k].value is None and k in training
                  else FLAGS[k].value for k in TRAIN_FLAGS},
    }
    files = {s: FLAGS[f"{s}_files"].value for s in ("train", "dev", "test")
             if FLAGS[f"{s}_files"].value}
    if files.get("train"):  # one corpus: a spec, as settings have always held it
        files["train"] = files["train"][0] if len(files["train"]) == 1 else files["train"]
    settings["data"]["files"] = files or None
    if FLAGS.vocab:  # the given model's size and type, not those of a learned one
        settings["data"].update(separate_vocabularies=separate, vocab_size=None, vocab_type=None)
    if FLAGS.train_weights:
        settings["data"]["train_weights"] = [float(w) for w in FLAGS.train_weights]
    explicit = {f"train.{k}" for k in TRAIN_FLAGS if FLAGS[k].present}
    # A number of updates given, or a cluster (whose workers must agree on it): no time budget.
    if FLAGS["train_steps"].present or FLAGS.strategy == "multi_worker":
        settings["train"]["train_minutes"] = 0.0
        explicit.add("train.train_minutes")
    explicit |= {f"data.{k}" for k in DATA_FLAGS if FLAGS[k].present}
    if FLAGS["vocab"].present:
        explicit |= {"data.separate_vocabularies", "data.vocab_size", "data.vocab_type"}
    if FLAGS.dataset == "files" and not FLAGS["dataset"].present:  # given files mean it
        explicit.add("data.dataset")
    given_splits = [s for s in ("train", "dev", "test") if FLAGS[f"{s}_files"].present]
    if given_splits:  # and which: a split left out keeps its saved files
        explicit |= {"data.files"} | {f"data.files.{s}" for s in given_splits}
    explicit |= {"data.train_weights"} if FLAGS["train_weights"].present else set()
    explicit |= {f"model.{k}" for k in MODEL_FLAGS if FLAGS[k].present}
    if FLAGS["preset"].present:  # a preset sets every size (not max_length, a flag of its own)
        explicit |= {f"model.{k}" for k in model if k != "max_length"}
    explicit.add("model.max_length") if FLAGS["max_length"].present else None
    return settings, explicit


def check_eval_beam_memory(settings):
    """One line (app.UsageError) for an --eval_beam_size of which one dev sentence's search
    would not fit in this machine's memory (`search_memory.check_beam`): the run would fail at
    its first evaluation."""
    beam = settings["train"].get("eval_beam_size", 1)
    if beam == 1:
        return
    from tfnmt.data.vocabulary import piece_count
    from tfnmt.inference.search_memory import SearchMemoryError, check_beam

    model, d = settings["model"], settings["data"]
    if not model.get("vocab_size"):  # not made yet: the size asked for, or --vocab's
        given = [d["vocab"]] if isinstance(d.get("vocab"), str) else d.get("vocab")
        model = dict(model, vocab_size=max(map(piece_count, given)) if given
                     else d["vocab_size"])
    try:
        check_beam(model, beam, "--eval_beam_size")
    except SearchMemoryError as error:
        raise app.UsageError(str(error))


def check_paths():
    """One line (app.UsageError) for a path that cannot work, before any work starts."""
    from tfnmt.data.corpus import CorpusError, check_files

    if FLAGS.dataset == "files":
        for split in ("train", "dev", "test"):
            specs = FLAGS[f"{split}_files"].value or []
            for spec in [specs] if isinstance(specs, str) else specs:
                try:
                    check_files(spec)
                except CorpusError as error:
                    raise app.UsageError(f"--{split}_files: {error}")
    if FLAGS.train_weights:
        given, corpora = ",".join(FLAGS.train_weights), len(FLAGS.train_files or [])
        try:
            weights = [float(w) for w in FLAGS.train_weights]
        except ValueError:
            raise app.UsageError(f"--train_weights={given}: numbers, one per --train_files")
        if len(weights) != corpora:
            raise app.UsageError(f"--train_weights={given}: {len(weights)} weight(s) for "
                                 f"{corpora} --train_files: one per corpus, in their order")
        if not all(0 < w < math.inf for w in weights):  # NaN fails too
            raise app.UsageError(f"--train_weights={given}: each weight must be a positive "
                                 "number")
    if FLAGS.vocab:
        data_checks.check_vocab_given()
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir must name a directory")
    for flag in ("model_dir", "data_dir"):
        path = FLAGS[flag].value
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise app.UsageError(f"--{flag}={path} is a file, not a directory")
        try:
            if path:
                os.makedirs(path, exist_ok=True)
        except OSError as error:
            raise app.UsageError(f"--{flag}={path}: cannot create it ({error.strerror})")
    # A run writes there from its first step (a resumed one: the lock of its checkpoints).
    if reason := cannot_write_in(FLAGS.model_dir):
        raise app.UsageError(f"--model_dir={FLAGS.model_dir}: cannot write in it ({reason}): "
                             "train.py keeps its settings, checkpoints and summaries there")


def starting_settings():
    """The requested settings and explicit flags; with --init_from, those of the source model.
    Raises SettingsError for an --init_from that cannot start this model_dir."""
    from tfnmt.paths import CHECKPOINTS, checkpoint_prefixes, read_settings
    from tfnmt.training.settings import SettingsError

    if not FLAGS.init_from:
        return requested_settings()
    from tfnmt.training import fine_tune  # reads the source's checkpoints with TensorFlow

    source = fine_tune.resolve_source(FLAGS.init_from, FLAGS.init_optimizer)
    saved = read_settings(FLAGS.model_dir) or {}
    started = checkpoint_prefixes(os.path.join(FLAGS.model_dir, CHECKPOINTS))
    if started and saved.get("init_from") != source:
        raise SettingsError(f"--init_from: {FLAGS.model_dir} holds a trained model already; "
                            "fine-tune into a new --model_dir (or drop --init_from to resume)")
    settings, explicit = requested_settings(read_settings(source["model_dir"]).get("preset"))
    return fine_tune.apply_source(settings, explicit, source), explicit


def use_files_given():
    """--train_files and the like name the user's own corpus: --dataset=files unless --dataset
    says otherwise, which is refused (the files would be left unread)."""
    given = [f"--{name}" for name in ("train_files", "dev_files", "test_files", "train_weights")
             if FLAGS[name].present]
    if not given or FLAGS.dataset == "files":
        return
    if FLAGS["dataset"].present:
        raise app.UsageError(f"{given[0]} is for --dataset=files, and --dataset={FLAGS.dataset} "
                             f"reads its own splits: give --dataset=files, or drop {given[0]}")
    FLAGS.dataset = "files"


CLUSTER_WITH_BUDGET = ("--train_minutes plans on one machine; the workers of a cluster need "
                       "--train_steps")


def resolve_cluster_strategy():
    """--strategy=auto becomes multi_worker where TF_CONFIG names several training processes
    (what distribute.make_strategy chooses), decided here, before TensorFlow loads, so that every
    rule of a cluster run applies to it (no time budget: the workers must agree on the number of
    updates); a TF_CONFIG that cannot place this process in its cluster is refused in one line,
    and so is a cluster of several processes with a strategy that trains in one process."""
    from tfnmt.training import cluster

    if FLAGS.strategy not in ("auto", "multi_worker"):
        try:
            processes = cluster.training_processes(cluster.read_tf_config())
        except cluster.ClusterConfigError:
            return  # read by the cluster strategies only
        if processes > 1:  # each process would train a model of its own
            raise app.UsageError(f"--strategy={FLAGS.strategy} trains in this process alone, "
                                 f"and TF_CONFIG names a cluster of {processes} training "
                                 "processes: give --strategy=multi_worker (or auto) to train "
                                 "on the cluster, or unset TF_CONFIG")
        return
    try:
        config = cluster.read_tf_config()
        if FLAGS.strategy == "auto" and cluster.training_processes(config) > 1:
            if FLAGS["train_minutes"].present:
                raise app.UsageError(CLUSTER_WITH_BUDGET)
            FLAGS.strategy = "multi_worker"
        if FLAGS.strategy == "multi_worker":
            cluster.check_training_task(config)
            cluster.check_own_port_free(config)
    except cluster.ClusterConfigError as error:
        raise app.UsageError(str(error))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    use_files_given()
    # A resumed run has its files in settings.json (a file flag given is compared with them).
    new_run = not (FLAGS.model_dir and os.path.isfile(os.path.join(FLAGS.model_dir, SETTINGS)))
    if FLAGS.dataset == "files" and not FLAGS.train_files and new_run:
        raise app.UsageError("--dataset=files (your own corpus) needs --train_files (and "
                             "--dev_files for BLEU)")
    if FLAGS.dataset == "files" and not FLAGS.dev_files and new_run:
        raise app.UsageError("--dataset=files needs --dev_files: evaluation reports dev BLEU")
    if FLAGS.dataset == "files" and FLAGS["tfds_data_dir"].present:
        raise app.UsageError("--tfds_data_dir is where TFDS datasets are, and --dataset=files "
                             "reads your files: drop --tfds_data_dir")
    if FLAGS["train_minutes"].present and FLAGS["train_steps"].present:
        raise app.UsageError("give --train_steps or --train_minutes, not both")
    if FLAGS["train_minutes"].present and FLAGS.strategy == "multi_worker":
        raise app.UsageError(CLUSTER_WITH_BUDGET)
    resolve_cluster_strategy()
    if FLAGS.cpu_devices > 1 and FLAGS.strategy != "mirrored":  # else trains on one of them
        raise app.UsageError(f"--cpu_devices={FLAGS.cpu_devices} splits the CPU for "
                             "--strategy=mirrored: add it, or drop --cpu_devices")
    if FLAGS.separate_vocabularies and FLAGS.share_embeddings:
        raise app.UsageError("--share_embeddings needs one shared vocabulary: drop it or "
                             "--separate_vocabularies")
    if FLAGS.init_optimizer and not FLAGS.init_from:
        raise app.UsageError("--init_optimizer needs --init_from")
    check_paths()
    # The flags and settings are checked before TensorFlow loads: a refusal comes at once.
    from tfnmt.model.presets import check_sizes
    from tfnmt.training.settings import SettingsError, resolve_settings

    if FLAGS.cpu_devices > 1:  # logical CPUs: set before anything starts TensorFlow's devices
        from tfnmt.training import distribute

        distribute.split_cpu(FLAGS.cpu_devices)
    try:
        settings, explicit = starting_settings()
        settings = resolve_settings(settings, explicit, FLAGS.model_dir)
    except SettingsError as error:
        raise app.UsageError(str(error))
    if FLAGS.strategy != "multi_worker":  # a cluster's workers may not share the report
        from tfnmt.training import finished

        ended = finished.reported_end(FLAGS.model_dir, finished.end_record(
            settings, FLAGS.alpha, FLAGS.test_report, end_no_repeat()))
        if ended:
            print(f"{FLAGS.model_dir}: this run has done its {settings['train']['train_steps']:,d}"
                  " updates (a larger --train_steps trains it further); its end as reported "
                  f"then ({REPORT}: delete it to evaluate and report again):", flush=True)
            print(dev_line(settings, ended["dev_greedy"]), flush=True)
            print(report_text(settings, ended["test"]), flush=True)
            return 0
    try:
        check_sizes(settings["model"])
    except ValueError as error:
        raise app.UsageError(str(error))
    t = settings["train"]
    check_eval_beam_memory(settings)
    try:  # ja-mecab and ko-mecab need packages of their own: said before the training
        bleu_tokenization.check_available(t.get("bleu_tokenize", bleu_tokenization.AUTO))
    except ValueError as error:
        raise app.UsageError(str(error))
    if t.get("early_stopping") and not t.get("eval_every"):  # it would never stop
        default = "" if FLAGS["eval_every"].present else " (the preset's default)"
        raise app.UsageError(f"--early_stopping={t['early_stopping']} counts dev evaluations "
                             f"during the run, and --eval_every is 0{default}: give "
                             "--eval_every")
    data_checks.check_subword_sampling(settings)
    data_checks.check_text_sides(settings)  # before the checks that compare sentences
    data_checks.check_fine_tuning_direction(settings)
    data_checks.check_held_out_order(settings)
    data_checks.check_copied_sides(settings)
    if FLAGS["subword_nbest"].present and not t.get("subword_alpha"):  # it would change nothing
        raise app.UsageError("--subword_nbest is for subword sampling, which --subword_alpha "
                             "turns on (it is 0 for this run): give --subword_alpha, or drop "
                             "--subword_nbest")
    if t.get("average_last", 0) > t["keep_checkpoints"]:  # it would average fewer
        raise app.UsageError(f"--average_last={t['average_last']} averages the last "
                             f"{t['average_last']} checkpoints, and --keep_checkpoints="
                             f"{t['keep_checkpoints']} keeps {t['keep_checkpoints']}: raise "
                             "--keep_checkpoints")
    import tensorflow as tf

    from tfnmt import fast_ops
    from tfnmt.checkpoints import ModelDirError
    from tfnmt.data import records
    from tfnmt.data.corpus import CorpusError
    from tfnmt.data.data_dir_lock import DataDirInUseError
    from tfnmt.data.pipeline import BatchingError
    from tfnmt.training import cluster_sync, distribute, experiment
    from tfnmt.training.stop_signals import TrainingInterrupted, stopping_at_once
    from tfnmt.training.trainer import TrainingError

    if FLAGS.strategy == "multi_worker":  # the strategy waits until every process has joined
        from tfnmt.training import cluster

        config = cluster.read_tf_config()
        print(f"joining the cluster as {config['task']['type']} {config['task']['index']} of "
              f"{cluster.training_processes(config)} training processes (waits until each has "
              "started)", flush=True)
    try:
        with stopping_at_once():  # for every other training process to start
            strategy = distribute.make_strategy(FLAGS.strategy)
    except tf.errors.UnknownError as error:  # its port taken since resolve_cluster_strategy
        if "Could not start gRPC server" not in str(error):
            raise
        from tfnmt.training import cluster

        raise app.UsageError(cluster.port_in_use(cluster.read_tf_config())) from None
    fast_ops.set_plain_ops(FLAGS.plain_ops)
    print(f"memory allocator: {cli.ALLOCATOR}; CPU kernels: {cli.KERNELS}"
          + (f"; TensorFlow threads: {cli.THREADS}" if cli.THREADS else "")
          + ("; stock ops (--plain_ops)" if FLAGS.plain_ops else ""), flush=True)
    # A process of a cluster stops right after its line: with another process gone or
    # stopping, TensorFlow's heartbeat thread would log the lost task after it as the
    # interpreter tears down (what the run wrote is closed by then: checkpoints, summaries).
    one_line_stop = cli.ExitAtOnce if cluster_sync.in_cluster(strategy) else app.UsageError
    try:
        metrics = experiment.run(settings, strategy, log=lambda m: print(m, flush=True),
                                 no_repeat_ngram_size=end_no_repeat())
    except (TrainingError, SettingsError, ModelDirError, CorpusError, BatchingError,
            records.PreparedDataError, DataDirInUseError) as error:
        raise one_line_stop(str(error)) from None
    except TrainingInterrupted as interrupted:  # Ctrl-C or SIGTERM: the last update is saved
        print(interrupted, flush=True)
        return 128 + interrupted.signum  # as a shell reports a process the signal ended
    if metrics is None:  # a worker other than the chief: the chief reports, then all leave
        if not cluster_sync.leave_together(strategy):
            raise one_line_stop("the chief stopped before the end of its report (its output "
                                "says why); this worker's training is complete")
        return 0
    print(dev_line(settings, metrics), flush=True)
    final_report(settings, metrics)
    cluster_sync.leave_together(strategy)  # a worker gone by now has nothing left to do


def dev_line(settings, metrics):
    """The line of the run's final dev score."""
    search = "greedy" if settings["train"]["eval_beam_size"] == 1 \
        else f"beam {settings['train']['eval_beam_size']}"
    rule = end_no_repeat() if search != "greedy" else 0
    if rule:
        search += f", no repeated {rule}-grams of subwords"
    return f"dev sacreBLEU {metrics['bleu']:.2f} ({search})  ({FLAGS.model_dir})"


def report_text(settings, test):
    """The test report (`report.format_report`; None: none) and the next commands."""
    from tfnmt.data.corpus import EMBEDDED
    from tfnmt.training import report

    data = settings["data"]
    return report.format_report(test, FLAGS.model_dir, data.get("reverse", False),
                                own_data=data["dataset"] != EMBEDDED)


def end_no_repeat():
    """The no-repeat rule of the run's end: --no_repeat_ngram_size, else the one its model_dir
    keeps (decoding.json, as a run given it left it), else 0."""
    if FLAGS.no_repeat_ngram_size is not None:
        return FLAGS.no_repeat_ngram_size
    return default_no_repeat(FLAGS.model_dir)[0]


def final_report(settings, dev_metrics):
    """Test scores, samples and next commands (printed, and in <model_dir>/report.json)."""
    import keras

    from tfnmt.data.corpus import CorpusError
    from tfnmt.inference import length_penalty
    from tfnmt.training import finished, report
    from tfnmt.training.evaluator import run_bleu_tokenization
    from tfnmt.training.settings import resolve_settings

    keras.config.set_dtype_policy("float32")  # the model as exported
    result = None
    # What this end read, so that the same command run again reprints it (training/finished.py):
    # with the settings as that command resolves them (saved ones, defaults filled in).
    no_repeat = end_no_repeat()
    end = finished.end_record(resolve_settings(settings, set(), FLAGS.model_dir), FLAGS.alpha,
                              FLAGS.test_report, no_repeat)
    try:
        bleu_tokenize, _ = run_bleu_tokenization(settings)
        alpha = length_penalty.parse_alpha(FLAGS.alpha)
        translator = report.ServedTranslator(FLAGS.model_dir,  # loads on first use
                                             no_repeat_ngram_size=no_repeat)
        if alpha is None:
            alpha, scores = report.choose_length_penalty(translator, settings,
                                                         bleu_tokenize=bleu_tokenize)
            rule = f", no repeated {no_repeat}-grams of subwords" if no_repeat else ""
            if alpha is None:
                alpha = length_penalty.PAPER_ALPHA
                length_penalty.write_choice(FLAGS.model_dir, alpha, no_repeat_ngram_size=no_repeat,
                                            chosen_on="the paper's: no dev pairs")
                print(f"length penalty: {alpha:g}, the paper's (the dev split is empty)",
                      flush=True)
            else:
                tried = ", ".join(f"{a:g}: {s:.2f}" for a, s in scores.items())
                print(f"length penalty: {alpha:g}, chosen on dev (beam 4{rule}, sacreBLEU "
                      f"{tried})", flush=True)
        else:
            length_penalty.write_choice(FLAGS.model_dir, alpha, no_repeat_ngram_size=no_repeat)
        if FLAGS.test_report:
            result = report.test_report(translator, settings, alpha=alpha,
                                        bleu_tokenize=bleu_tokenize)
    except (CorpusError, OSError) as error:  # training succeeded: say why, keep its results
        if isinstance(error, OSError) and error.filename and error.strerror:
            error = f"{error.filename}: {error.strerror}"
        print(f"no test report: {error}; run the same command again for it", flush=True)
        end = None  # a run started again tries once more
    report.write_report(FLAGS.model_dir, {"dev_greedy": dev_metrics, "test": result,
                                          "end": end})
    print(report_text(settings, result), flush=True)


def run():
    """The `train.py` / `tfnmt-train` command."""
    logging.set_verbosity(logging.WARNING)
    cli.run(main, __doc__, training=True)


if __name__ == "__main__":
    run()
