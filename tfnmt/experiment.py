"""One training run in a model_dir: settings, data, the loop, evaluation, averaging.

model_dir layout:
  settings.json      every setting of the run (export and evaluation read it)
  spm.model          the shared vocabulary
  data/              prepared TFRecords (unless --data_dir points elsewhere)
  checkpoints/       ckpt-<step> written by tf.train.CheckpointManager; .lock held by the
                     process that trains (one writer per model_dir)
  averaged/          the average of the last N checkpoints (--average_last)
  train/, eval/      TensorBoard event files
  workers/<id>/      non-chief workers' checkpoints under multi_worker
"""
import errno
import inspect
import json
import os
import re
import shutil
import time

import keras
import tensorflow as tf

from tfnmt import data, records
from tfnmt.checkpoints import DirectoryLock, checkpoint_prefixes, newest_readable_checkpoint
from tfnmt.corpus import read_corpus
from tfnmt.distribute import PreReducedAdam, resolve_mixed_precision, task_role
from tfnmt.evaluation import Translator, corpus_scores, evaluate_loss, loss_sums_function
from tfnmt.model import Transformer
from tfnmt.paths import SETTINGS
from tfnmt.schedule import paper_adam
from tfnmt.summaries import rss_bytes, write_attention_images
from tfnmt.tokenizer import Tokenizer
from tfnmt.training import CheckpointKeeper, Trainer, average_checkpoints

# Settings a run in an existing model_dir must share with it: every model and training setting
# but those meant to change on resume, and the data that defines the vocabulary.
FIXED_DATA = ("dataset", "files", "vocab_size", "vocab_type")
RESUMABLE_TRAIN = ("train_steps", "log_every", "eval_every", "bleu_sentences",
                   "checkpoint_every", "keep_checkpoints", "average_last", "jit_compile",
                   "mixed_precision")
POLICIES = {"none": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# fp16 loss scaling halves the scale at each skipped update: this many in a row is divergence.
MAX_SKIPPED_IN_A_ROW = 64


class SettingsError(ValueError):
    pass


class TrainingError(RuntimeError):
    """Training cannot go on (the checkpoints written so far are kept)."""


def load_settings(model_dir):
    path = os.path.join(model_dir, SETTINGS)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


MODEL_DEFAULTS = {name: parameter.default for name, parameter
                  in inspect.signature(Transformer.__init__).parameters.items()
                  if parameter.default is not inspect.Parameter.empty and name != "dtype"}


def is_fixed(section, key):
    """Whether a resumed run must keep this setting (section "model", "data" or "train")."""
    return (section == "model" or (section == "data" and key in FIXED_DATA)
            or (section == "train" and key not in RESUMABLE_TRAIN))


def _fp16_switch(name, new, old):
    # fp16 adds loss-scale state to the checkpoints: a switch to or from it cannot resume.
    return name == "train.mixed_precision" and new != old and "fp16" in (new, old)


def resolve_settings(requested, explicit, model_dir):
    """Settings for this run: `requested` (from flags), where the flags not given explicitly
    (`explicit`: set of "section.key") take the values saved in model_dir. An explicit value
    that changes a fixed saved setting (`is_fixed`; a setting the saved file does not record
    counts as changed) is an error, raised before any work, as are checkpoints without a
    saved settings file (nothing could tell whether they fit these settings)."""
    saved = load_settings(model_dir)
    if saved is None:
        if checkpoint_prefixes(os.path.join(model_dir, "checkpoints")):
            raise SettingsError(f"{model_dir} holds checkpoints but no {SETTINGS}: nothing says "
                                "which model they hold. Restore the file or use a new "
                                "--model_dir.")
        return requested
    resolved = json.loads(json.dumps(requested))
    conflicts = []
    for section in ("model", "data", "train"):
        ours, theirs = resolved.setdefault(section, {}), saved.get(section) or {}
        if section == "model":  # the saved model was built with the defaults of what it omits
            theirs = dict(MODEL_DEFAULTS, **theirs)
        for key in sorted(set(ours) | set(theirs)):
            name = f"{section}.{key}"
            if name not in explicit:
                if key in theirs:
                    ours[key] = theirs[key]
            elif (is_fixed(section, key) or _fp16_switch(name, ours.get(key), theirs.get(key))) \
                    and (key not in theirs or ours.get(key) != theirs[key]):
                before = repr(theirs[key]) if key in theirs else "not recorded"
                conflicts.append(f"{key}={ours.get(key)!r} (saved: {before})")
    if conflicts:
        raise SettingsError(f"{model_dir} holds a run with other settings: "
                            f"{', '.join(conflicts)}. Use a new --model_dir, or drop these flags "
                            "to continue the saved run.")
    return resolved


def _write_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)  # atomic: the old file or the new one, never half of one


def _wait_for_data(data_dir, timeout):
    deadline = time.time() + timeout
    while True:
        try:
            return records.load_manifest(data_dir)
        except records.PreparedDataError:
            if time.time() > deadline:
                raise
            time.sleep(2)


class Evaluator:
    """Dev loss/perplexity, sacreBLEU/chrF of greedy translations, samples and attention."""

    def __init__(self, model, tokenizer, settings, data_dir):
        self.model = model
        self.settings = settings
        d = settings["data"]
        self.data_dir = data_dir
        self.pairs = list(read_corpus(d["dataset"], "dev", (d.get("files") or {}).get("dev"),
                                      d.get("tfds_data_dir")))
        limit = settings["train"].get("bleu_sentences") or len(self.pairs)
        self.pairs = self.pairs[:limit]
        self.translator = Translator(model, tokenizer, d["max_length"])
        self.loss_sums = loss_sums_function(model, settings["train"]["label_smoothing"])
        self.tokenizer = tokenizer

    def __call__(self, step, writer=None):
        t = self.settings["train"]
        dev = data.make_dataset(self.data_dir, "dev", t["batch_tokens"],
                                self.settings["data"]["max_length"], shuffle=False)
        metrics = evaluate_loss(self.model, dev, sums=self.loss_sums)
        sources = [s for s, _ in self.pairs]
        hypotheses = self.translator.translate(sources)
        metrics.update(corpus_scores(hypotheses, [r for _, r in self.pairs]))
        if writer is not None:
            with writer.as_default():
                for name, value in metrics.items():
                    tf.summary.scalar(name, value, step=step)
                samples = [f"**source** {s}  \n**reference** {r}  \n**translation** {h}"
                           for (s, r), h in list(zip(self.pairs, hypotheses))[:4]]
                tf.summary.text("samples", tf.constant(samples), step=step)
                source_ids = self.translator.source_ids(sources[:1])
                target = self.tokenizer.tokenize([self.pairs[0][1]])[:, :50].to_tensor()
                target_in = tf.concat([tf.fill([1, 1], 2), target], axis=1)
                write_attention_images(self.model, source_ids, target_in, step)
            writer.flush()
        return metrics


def is_disk_full(error):
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(error, tf.errors.OpError) and "No space left on device" in str(error)


def _unwritable_file(error):
    """The file a disk-full error is about: OSError says; TensorFlow names it in its message
    (the word that is a path in an existing directory)."""
    if isinstance(error, OSError) and error.filename:
        return error.filename
    for word in re.split(r"[\s;'\"]+", str(error)):
        if os.sep in word and os.path.isdir(os.path.dirname(word) or "."):
            return re.sub(r"\.tempstate\d+$", "", word)
    return "a file"


def run(settings, strategy, log=print):
    """Trains (or resumes) until settings["train"]["train_steps"]; returns the final metrics.
    A full disk or damaged prepared data stop it with TrainingError (one line; the
    checkpoints written so far are kept)."""
    model_dir = settings["model_dir"]
    is_chief, task_id = task_role(strategy)
    checkpoint_dir = (os.path.join(model_dir, "checkpoints") if is_chief
                      else os.path.join(model_dir, "workers", str(task_id)))
    data_dir = settings["data"].get("data_dir") or os.path.join(model_dir, "data")
    try:
        with DirectoryLock(checkpoint_dir):  # one writer per checkpoint directory
            return _run(settings, strategy, log, checkpoint_dir, data_dir)
    except tf.errors.DataLossError:  # TensorFlow names no file: find the shard that is damaged
        manifest = records.load_manifest(data_dir, check_shards=False)
        damaged = records.damaged_shards(data_dir, manifest)
        if not damaged:
            raise
        newest = newest_readable_checkpoint(checkpoint_dir)
        raise TrainingError(f"{damaged[0][1]}; stopped with the newest intact checkpoint "
                            f"{newest or 'none'} (run again: the damaged split is rewritten "
                            "and training resumes)") from None
    except (OSError, tf.errors.OpError) as error:
        if not is_disk_full(error):
            raise
        newest = newest_readable_checkpoint(checkpoint_dir)
        raise TrainingError(f"no space left on the device to write {_unwritable_file(error)}; "
                            f"the newest intact checkpoint is {newest or 'none'} (free space "
                            "and run again to resume from it)") from None


def _run(settings, strategy, log, checkpoint_dir, data_dir):
    model_dir = settings["model_dir"]
    d, t = settings["data"], settings["train"]
    is_chief, _ = task_role(strategy)
    # Seed before any tokenizer exists: tf.random.set_seed deletes their TF resources.
    keras.utils.set_random_seed(t["seed"])
    os.makedirs(model_dir, exist_ok=True)
    saved = load_settings(model_dir)
    # A trained model's vocabulary is its own: data rebuilt for it is tokenized with it.
    model_vocab = os.path.join(model_dir, records.VOCAB)
    model_fingerprint = records.readable_fingerprint(model_vocab) if saved else None
    if is_chief:
        manifest = records.prepare(data_dir, d["dataset"], d.get("files"), d.get("tfds_data_dir"),
                                   d["vocab_size"], d["vocab_type"],
                                   model_vocab=model_vocab if model_fingerprint else None)
    else:
        manifest = _wait_for_data(data_dir, t.get("data_wait_secs", 1800))
    tokenizer = Tokenizer(os.path.join(data_dir, records.VOCAB))
    if saved:
        trained_with = model_fingerprint or saved.get("vocab_fingerprint")
        if trained_with not in (None, tokenizer.fingerprint):
            raise SettingsError(f"{model_dir} was trained with another vocabulary than "
                                f"{data_dir}")
    settings["vocab_fingerprint"] = tokenizer.fingerprint
    settings["model"]["vocab_size"] = tokenizer.vocab_size
    if is_chief:  # atomically: a kill mid-copy must not leave the model a truncated vocabulary
        shutil.copyfile(tokenizer.model_path, model_vocab + ".tmp")
        os.replace(model_vocab + ".tmp", model_vocab)
    precision = resolve_mixed_precision(t["mixed_precision"])
    log(f"data: {manifest['splits']['train']['examples']:,d} training pairs, "
        f"vocabulary {tokenizer.vocab_size:,d}, {strategy.num_replicas_in_sync} replica(s), "
        f"precision {precision}")
    keras.config.set_dtype_policy(POLICIES[precision])
    with strategy.scope():
        model = Transformer(**settings["model"])
        model.build()
        optimizer = paper_adam(model.d_model, t["warmup_steps"], t["lr_scale"], PreReducedAdam)
        if precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    keeper = CheckpointKeeper(checkpoint_dir, model, optimizer,
                              t["keep_checkpoints"] if is_chief else 1)
    restored = keeper.restore()
    if is_chief:  # only once the checkpoint has read back into a model of these settings
        _write_json(os.path.join(model_dir, SETTINGS), settings)
    step = int(optimizer.iterations.numpy())
    log(f"resumed from {restored} at step {step}" if restored else "starting from scratch")

    def dataset_fn(context):
        # A resumed run reshuffles with a new seed rather than replaying the first batches.
        return data.make_dataset(data_dir, "train", t["batch_tokens"], d["max_length"],
                                 shuffle=True, seed=t["seed"] + step, repeat=True,
                                 input_context=context, vocab_fingerprint=tokenizer.fingerprint,
                                 shape_stable=t.get("shape_stable", True),
                                 bucket_growth=t.get("bucket_growth", 1.1))

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    trainer = Trainer(model, optimizer, strategy, t["label_smoothing"], t["accum_steps"],
                      t.get("jit_compile", False))
    train_writer = tf.summary.create_file_writer(os.path.join(model_dir, "train")) \
        if is_chief else tf.summary.create_noop_writer()
    eval_writer = tf.summary.create_file_writer(os.path.join(model_dir, "eval")) \
        if is_chief else None
    evaluator = Evaluator(model, tokenizer, settings, data_dir)

    window = {"loss": 0.0, "tokens": 0.0, "grad_norm": 0.0, "padding": 0.0, "steps": 0}
    window_start = run_start = time.time()
    first_step, skipped, streak = step, 0, 0
    while step < t["train_steps"]:
        out = {k: float(v) for k, v in trainer.train_step(iterator).items()}
        window["loss"] += out["loss"] * out["target_tokens"]
        window["tokens"] += out["target_tokens"]
        window["grad_norm"] += out["grad_norm"]
        window["padding"] += out["padding_fraction"]
        window["steps"] += 1
        # Steps count applied updates: with fp16 loss scaling an overflowing update is skipped
        # (and the scale lowered), so the optimizer's count is the truth, not the loop's.
        applied = int(optimizer.iterations.numpy())
        if applied == step:
            skipped += 1
            streak += 1
            if streak > MAX_SKIPPED_IN_A_ROW:  # the scale is ~2^-50 by now: not an overflow
                raise TrainingError(f"step {step + 1}: {streak} updates in a row had non-finite "
                                    "gradients at every loss scale; the loss has diverged "
                                    "(lower --lr_scale or use --mixed_precision=bf16|none)")
            continue
        step, streak = applied, 0
        if step % t["log_every"] == 0 or step == t["train_steps"]:
            elapsed = time.time() - window_start
            speed = window["tokens"] / max(elapsed, 1e-9)
            rate = (step - first_step) / max(time.time() - run_start, 1e-9)
            eta = (t["train_steps"] - step) / max(rate, 1e-9)
            lr = float(optimizer.learning_rate)
            loss = window["loss"] / max(window["tokens"], 1.0)
            rss_gib = rss_bytes() / 2 ** 30
            log(f"step {step:6d}/{t['train_steps']} | loss {loss:.3f} | lr {lr:.2e} | "
                f"{speed:,.0f} tgt tok/s | RSS {rss_gib:.2f} GiB | "
                f"ETA {int(eta // 60)}m{int(eta % 60):02d}s"
                + (f" | {skipped} overflowing updates skipped" if skipped else ""))
            with train_writer.as_default():
                tf.summary.scalar("loss", loss, step=step)
                tf.summary.scalar("learning_rate", lr, step=step)
                tf.summary.scalar("grad_norm", window["grad_norm"] / window["steps"], step=step)
                tf.summary.scalar("tokens_per_sec", speed, step=step)
                tf.summary.scalar("rss_gib", rss_gib, step=step)
                tf.summary.scalar("padding_fraction", window["padding"] / window["steps"],
                                  step=step)
            window = dict.fromkeys(window, 0.0)
            window_start = time.time()
        if step % t["checkpoint_every"] == 0 or step == t["train_steps"]:
            keeper.save(step)
        if t["eval_every"] and (step % t["eval_every"] == 0) and step < t["train_steps"]:
            eval_start = time.time()
            metrics = evaluator(step, eval_writer)
            log(_format_metrics(step, metrics))
            # Training speed and ETA exclude evaluation time.
            window_start += time.time() - eval_start
            run_start += time.time() - eval_start
    train_writer.flush()

    final_name = "latest"
    if t["average_last"] > 1 and is_chief:
        paths = keeper.manager.checkpoints[-t["average_last"]:]
        if len(paths) > 1:
            prefix = os.path.join(model_dir, "averaged", f"ckpt-{step}")
            average_checkpoints(model, paths, prefix)
            final_name = f"average of {len(paths)}"
            log(f"averaged {len(paths)} checkpoints into {prefix}")
    metrics = evaluator(step, eval_writer)
    log(_format_metrics(step, metrics, final_name))
    return metrics


def _format_metrics(step, metrics, weights=None):
    what = f" ({weights})" if weights else ""
    return (f"eval step {step}{what}: dev loss {metrics['loss']:.3f} | ppl "
            f"{metrics['perplexity']:.2f} | acc {metrics['accuracy']:.3f} | sacreBLEU "
            f"{metrics['bleu']:.2f} | chrF {metrics['chrf']:.2f}")
