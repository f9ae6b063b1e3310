"""One training run in a model_dir: data, model, the loop, evaluation, averaging.

model_dir layout:
  settings.json      every setting of the run (export and evaluation read it)
  spm.model          the shared vocabulary (source.spm.model, target.spm.model with
                     --separate_vocabularies)
  data/              prepared TFRecords (unless --data_dir points elsewhere)
  checkpoints/       ckpt-<step> written by tf.train.CheckpointManager; .lock held by the
                     process that trains (one writer per model_dir)
  averaged/          the average of the last N checkpoints (--average_last)
  best/              the checkpoint with the best dev metric (--best_metric) and best.json
  train/, eval/      TensorBoard event files
  workers/<id>/      a non-chief worker's saves under multi_worker, each removed once
                     written (every worker resumes from checkpoints/)
"""
import os
import re

import keras
import tensorflow as tf

from tfnmt.checkpoints import (DirectoryLock, checkpoint_prefixes,
                               newest_readable_checkpoint)
from tfnmt.data import data_dir_lock, pipeline, records, side_order, vocabulary
from tfnmt.model.transformer import Transformer
from tfnmt.paths import AVERAGED, BEST, CHECKPOINTS, SETTINGS, is_disk_full, read_settings
from tfnmt.training import cluster_sync, fine_tune
from tfnmt.training.best import BestCheckpoint
from tfnmt.training.budget import TrainingBudget
from tfnmt.training.distribute import (PreReducedAdam, batch_iterator, first_difference,
                                      task_role)
from tfnmt.training.evaluator import Evaluator
from tfnmt.training.late_dropout import DropoutStart
from tfnmt.training.precision import resolve_mixed_precision
from tfnmt.training.schedule import make_schedule, paper_adam
from tfnmt.training.settings import SettingsError, write_json
from tfnmt.training.stats import TrainingStats
from tfnmt.training.stop_signals import SIGNALS, StopSignals
from tfnmt.training.summaries import mark_run_start, write_hparams
from tfnmt.training.trainer import CheckpointKeeper, Trainer, TrainingError, average_checkpoints

# How a collective of a cluster fails when another worker has stopped (its sockets closed, or
# gone silent past the coordination service's heartbeat).
PEER_LOST = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
             tf.errors.DeadlineExceededError)

POLICIES = {"none": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# A time-budgeted run that fits few updates warms up for at most this share of them (the
# `cpu` preset's 800 of 2,200 updates is 36%).
MAX_WARMUP_SHARE = 0.4


def _within_warmup(t, updates):
    """A line where a run of `updates` updates ends within its warm-up (its learning rate
    still rising at the last one, as when the `base` preset's 4,000 warm-up updates meet a
    short run), else None."""
    warmup = t["warmup_steps"]
    if updates >= warmup:
        return None
    return (f"warning: the run's {updates:,d} updates end within its {warmup:,d}-update "
            "warm-up (--warmup_steps): its learning rate rises to the last one and never "
            "reaches its peak; a --warmup_steps of a tenth of the updates or so trains the "
            "model")


def _lost_peers(error, strategy):
    """The tasks other than this one that a cluster's failed collective names ("worker 1",
    "chief 0"), or "a task" where it names none."""
    resolver = strategy.cluster_resolver
    named = dict.fromkeys(re.findall(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)", str(error)))
    peers = [f"{job} {task}" for job, task in named
             if (job, int(task)) != (resolver.task_type, resolver.task_id)]
    return ", ".join(peers) if peers else "a task"


def _unwritable_file(error):
    """The file a disk-full error is about: OSError says; TensorFlow names it in its message
    (the word that is a path in an existing directory)."""
    if isinstance(error, OSError) and error.filename:
        return error.filename
    for word in re.split(r"[\s;'\"]+", str(error)):
        if os.sep in word and os.path.isdir(os.path.dirname(word) or "."):
            return re.sub(r"\.tempstate\d+$", "", word)
    return "a file"


def run(settings, strategy, log=print, no_repeat_ngram_size=0):
    """Trains (or resumes) the run in settings["model_dir"] until settings["train"]["train_steps"].

    Args:
      settings: the run's settings (`settings.resolve_settings`): model_dir, model, data, train.
      strategy: the `tf.distribute` strategy to train under.
      log: called with each line of the training log.
      no_repeat_ngram_size: the rule of the dev evaluations' beam searches
        (`--eval_beam_size` > 1), as the end of the run applies it; 0: none.

    Returns:
      The final dev metrics: loss, perplexity, accuracy, bleu, chrf (None on a worker other
      than the chief).

    Raises:
      TrainingError: a full disk, damaged prepared data, a diverged fp16 loss, a cluster
        worker lost or replicas whose weights differ (one line; the checkpoints written so far
        are kept).
      SettingsError: the model_dir's model was trained with another vocabulary.
    """
    model_dir = settings["model_dir"]
    is_chief, task_id = task_role(strategy)
    # Every process resumes from the chief's checkpoints (the newest named below); a cluster's
    # other workers take part in each save, writing copies they remove (`resume_from`).
    resume_dir = os.path.join(model_dir, CHECKPOINTS)
    checkpoint_dir = resume_dir if is_chief else os.path.join(model_dir, "workers", str(task_id))
    data_dir = settings["data"].get("data_dir") or os.path.join(model_dir, "data")
    try:
        cluster_sync.agree_on_start(strategy, settings)  # before the checkpoints are written
        with DirectoryLock(checkpoint_dir):  # one writer per checkpoint directory
            return _run(settings, strategy, log, checkpoint_dir, data_dir,
                        no_repeat_ngram_size)
    except tf.errors.DataLossError:  # TensorFlow names no file: find the shard that is damaged
        manifest = records.load_manifest(data_dir, check_shards=False)
        damaged = records.damaged_shards(data_dir, manifest)
        if not damaged:
            raise
        intact, resume = _resume_point(resume_dir)
        raise TrainingError(f"{damaged[0][1]}; stopped: {intact} (run again{resume}: the "
                            "damaged split is rewritten)") from None
    except (OSError, tf.errors.OpError) as error:
        if isinstance(error, PEER_LOST) and cluster_sync.in_cluster(strategy):
            intact, resume = _resume_point(resume_dir)
            raise TrainingError(f"{_lost_peers(error, strategy)} of the cluster stopped or "
                                f"cannot be reached; {intact} (start every worker's command "
                                f"again{resume})") from None
        if not is_disk_full(error):
            raise
        intact, resume = _resume_point(resume_dir)
        raise TrainingError(f"no space left on the device to write {_unwritable_file(error)}; "
                            f"{intact} (free space and run again{resume})") from None
    finally:
        data_dir_lock.release(data_dir)  # prepared (and held) by the chief in _prepare_data


def _resume_point(resume_dir):
    """("the newest intact checkpoint is <path>", " to resume from it") for a line that stops
    a run, or ("no checkpoint has been written yet", "") where there is none."""
    newest = newest_readable_checkpoint(resume_dir)
    if newest is None:
        return "no checkpoint has been written yet", ""
    return f"the newest intact checkpoint is {newest}", " to resume from it"


def _replicas_changed(t, replicas):
    """The log line of a run resumed with another number of replicas than it trained with."""
    before = t["replicas"]
    per_update = t["batch_tokens"] * t["accum_steps"]
    return (f"the run trained with {before} replica(s) and goes on with {replicas}: an update "
            f"now takes up to {per_update * replicas:,d} tokens (it took {per_update * before:,d}; "
            "--batch_tokens is per replica), at the learning rate of its step")


def _run(settings, strategy, log, checkpoint_dir, data_dir, no_repeat_ngram_size):
    model_dir = settings["model_dir"]
    t = settings["train"]
    is_chief, task_id = task_role(strategy)
    # Seed before any tokenizer exists: tf.random.set_seed deletes their TF resources.
    keras.utils.set_random_seed(t["seed"])
    os.makedirs(model_dir, exist_ok=True)
    # Before any work: it may refuse.
    precision, precision_reason = cluster_sync.agree_on_precision(
        strategy, t["mixed_precision"], resolve_mixed_precision)
    max_length = settings["data"]["max_length"]
    pipeline.bucket_batch_sizes([max_length + 1], t["batch_tokens"])  # refuses before any work
    manifest, vocab = _prepare_data(settings, strategy, data_dir)
    pipeline.check_pairs_fit(manifest, "train", max_length)  # before settings.json is written
    sampler = _subword_sampler(vocab, t)  # so is this: it may refuse the vocabulary's type
    sizes = f"{vocab.source.vocab_size:,d}" if vocab.shared else \
        f"{vocab.source.vocab_size:,d} source, {vocab.target.vocab_size:,d} target"
    log(f"data: {_describe_data(manifest, settings['data'])}, "
        f"vocabulary {sizes}, {strategy.num_replicas_in_sync} replica(s), "
        f"precision {precision}" + (f" ({precision_reason})" if precision_reason else ""))
    for line in _held_out_warnings(manifest):
        log(line)
    advice = _longer_pairs_advice(settings, checkpoint_dir)
    _check_dev_loss_measurable(manifest, max_length, t.get("best_metric", "bleu"), advice)
    if too_long := _too_long(manifest, max_length, advice):
        log(too_long)
    if precision == "fp16" and not tf.config.list_physical_devices("GPU"):
        log("fp16 is a GPU precision: CPUs train it slower than float32 (bench/README.md, "
            "fp16 on CPUs); --mixed_precision=auto picks what trains fastest here")
    model, optimizer, schedule = _build(settings, strategy, precision)
    chiefs = None if is_chief else os.path.join(model_dir, CHECKPOINTS)
    # A worker removes each save once written: its manager has only the newest to list.
    keeper = CheckpointKeeper(checkpoint_dir, model, optimizer,
                              t["keep_checkpoints"] if is_chief else 1, resume_from=chiefs)
    restored = keeper.restore()
    source = settings.get("init_from")
    if restored:
        log(f"resumed from {restored} at step {int(optimizer.iterations.numpy())}")
    elif source:
        step = fine_tune.initialize(model, optimizer, source)
        log(f"initialised from {source['checkpoint']}" +
            (f" with its optimizer at step {step}" if source["optimizer"] else
             " with a fresh optimizer"))
        if step >= t["train_steps"] and t.get("train_minutes"):
            # A time budget plans the run's end from this step on; until its first plan the
            # run's length counts from here too.
            t["train_steps"] += step
            schedule.set_plan(t["train_steps"])
        elif step >= t["train_steps"]:
            raise SettingsError(f"--train_steps={t['train_steps']}: the continued optimizer is "
                                f"at step {step} already; give a larger --train_steps")
    else:
        log("starting from scratch")
    replicas = strategy.num_replicas_in_sync
    if restored and t.get("replicas", replicas) != replicas:
        log(_replicas_changed(t, replicas))
    t["replicas"] = replicas  # --batch_tokens is per replica: the global batch depends on it
    if is_chief:  # only once the checkpoint has read back into a model of these settings
        write_json(os.path.join(model_dir, SETTINGS), settings)
        write_hparams(model_dir, settings)
    first_step = int(optimizer.iterations.numpy())

    def dataset_fn(context):
        # A resumed run reshuffles with a new seed rather than replaying the first batches.
        return pipeline.make_dataset(data_dir, "train", t["batch_tokens"],
                                     settings["data"]["max_length"], shuffle=True,
                                     seed=t["seed"] + first_step, repeat=True,
                                     input_context=context,
                                     vocab_fingerprint=vocab.fingerprint,
                                     shape_stable=t.get("shape_stable", True),
                                     bucket_growth=t.get("bucket_growth", 1.1),
                                     weights=settings["data"].get("train_weights"),
                                     subword_sampler=sampler)

    iterator = batch_iterator(strategy, dataset_fn)
    trainer = Trainer(model, optimizer, strategy, t["label_smoothing"], t["accum_steps"],
                      t.get("jit_compile", False), t.get("clip_norm", 0.0))
    train_writer = tf.summary.create_file_writer(os.path.join(model_dir, "train")) \
        if is_chief else tf.summary.create_noop_writer()
    eval_writer = tf.summary.create_file_writer(os.path.join(model_dir, "eval")) \
        if is_chief else None
    if is_chief:
        for writer in (train_writer, eval_writer):
            mark_run_start(writer, first_step + 1)
    evaluator = Evaluator(model, vocab, settings, data_dir, no_repeat_ngram_size)
    if evaluator.bleu_tokenize_why:
        log(f"BLEU tokenization: {evaluator.bleu_tokenize}: {evaluator.bleu_tokenize_why}")
    best = BestCheckpoint(os.path.join(model_dir, BEST), model, t.get("best_metric", "bleu"),
                          t.get("early_stopping", 0), write=is_chief,
                          bleu_tokenize=evaluator.bleu_tokenize)
    evaluated = {}  # the last evaluation: {step: metrics}

    def evaluate(step):
        """Evaluates, keeps the best checkpoint; returns whether to stop early."""
        metrics = evaluated[step] = evaluator(step, eval_writer)
        improved = best.update(step, metrics)
        log(_format_metrics(step, metrics) + (f" | best {best.metric}" if improved else ""))
        return _chief_decides(strategy, is_chief, best.should_stop)

    stats = TrainingStats(t["train_steps"], first_step, train_writer, log)
    # A time budget plans the run's length in a run that starts here, and goes on planning in
    # a run resumed before its plan stayed; otherwise the length saved with the settings holds.
    spent = keeper.restored_budget_seconds if restored else 0.0
    trains = first_step < t["train_steps"] and not best.should_stop
    budget = TrainingBudget(t["train_minutes"], first_step, spent_seconds=spent) \
        if t.get("train_minutes") and spent is not None and trains else None
    keeper.budget = budget
    if restored and budget is not None:
        log(f"resumed within the time budget: {spent / 60:.2f} of {t['train_minutes']:g} "
            "minutes trained; planning the rest from this run's pace")
    if trains and budget is None and (message := _within_warmup(t, t["train_steps"])):
        log(message)

    configured_warmup = t["warmup_steps"]
    dropout_start = _dropout_start(model, settings, manifest, first_step)

    def after_update(step, outputs):
        if dropout_start.started:  # nothing left to measure or start
            return
        started = dropout_start.update(step, outputs["target_tokens"])
        if t.get("dropout_from_step") is None and dropout_start.start_step is not None:
            t["dropout_from_step"] = dropout_start.start_step
            start, passed = dropout_start.start_step, dropout_start.epoch_step
            epoch = f"epoch {dropout_start.epochs:g} of the training data"
            log(f"dropout {dropout_start.rate:g} starts at update {start:,d} ("
                + (epoch if passed == start else
                   f"{epoch} passed at update {passed:,d}, while the first "
                   f"{dropout_start.measure_steps} updates measured it")
                + "), if the run gets there")
            if is_chief:  # a resumed run starts it at the same update
                write_json(os.path.join(model_dir, SETTINGS), settings)
        if started:
            trainer.retrace()
            if budget is not None:  # updates with dropout have their own pace
                budget.restart(step)
            log(f"step {step:,d}: dropout {dropout_start.rate:g} on")

    def on_plan(planned):
        t["train_steps"] = stats.train_steps = planned
        # A linear decay ends at the planned update; a short run warms up for at most
        # MAX_WARMUP_SHARE of it, to the same peak (either decay).
        schedule.set_plan(planned, min(configured_warmup, max(1, int(MAX_WARMUP_SHARE * planned))))
        t["warmup_steps"], t["lr_scale"] = schedule.warmup_steps, schedule.scale
        if budget.frozen or budget.planned_count == 1:
            minutes = t["train_minutes"]
            log(f"{'planned' if budget.frozen else 'planning'} {planned:,d} updates for "
                f"{minutes:g} minute{'' if minutes == 1 else 's'} of training" +
                ("" if budget.frozen else " (revised until half that time has passed)"))
            if is_chief:  # a run resumed after this keeps this length
                write_json(os.path.join(model_dir, SETTINGS), settings)
                if budget.frozen:  # TensorBoard's settings: the planned length, warm-up, rate
                    write_hparams(model_dir, settings)

    if best.should_stop:
        step = first_step
        log(f"stopped early before: {_early_stop_reason(best)}; raise --early_stopping (or "
            "set it to 0) to train on")
    else:
        # A signal stops at the next update, saved (one process; a cluster's workers would
        # have to agree on the step, so their signals act as usual).
        with StopSignals(() if cluster_sync.in_cluster(strategy) else SIGNALS) as stop:
            try:
                step = trainer(iterator, t["train_steps"], keeper=keeper, stats=stats,
                               evaluate=evaluate, log_every=t["log_every"],
                               checkpoint_every=t["checkpoint_every"],
                               eval_every=t["eval_every"], budget=budget, on_plan=on_plan,
                               after_update=None if dropout_start is None
                               or dropout_start.started else after_update, stop=stop)
            finally:  # TensorBoard gets every logged update, however the loop ends
                train_writer.flush()
        if step < t["train_steps"]:
            log(f"stopped early at step {step}: {_early_stop_reason(best)}")
    train_writer.flush()
    if strategy.num_replicas_in_sync > 1:
        _check_one_model(strategy, model, optimizer, step)

    if not is_chief:  # the chief evaluates the run's final weights (perhaps averaged) and reports
        log(f"worker {task_id} done at step {step}; the chief reports the run's dev scores")
        return None
    final_name = "latest"
    if t["average_last"] > 1:
        paths = keeper.manager.checkpoints[-t["average_last"]:]
        if len(paths) > 1:
            prefix = os.path.join(model_dir, AVERAGED, f"ckpt-{step}")
            average_checkpoints(model, paths, prefix)
            final_name = f"average of {len(paths)}"
            log(f"averaged {len(paths)} checkpoints into {prefix}")
    if final_name == "latest" and step in evaluated:  # stopped early: just evaluated
        return evaluated[step]
    metrics = evaluator(step, eval_writer)
    if final_name == "latest":  # averaged weights are kept in averaged/, not as the best
        improved = best.update(step, metrics)
        final_name += f", best {best.metric}" if improved else ""
    log(_format_metrics(step, metrics, final_name))
    return metrics


def _dropout_start(model, settings, manifest, first_step):
    """The run's `DropoutStart`, or None where dropout is on from the start (or off)."""
    t, rate = settings["train"], settings["model"].get("dropout", 0.0)
    epochs = t.get("dropout_from_epoch", 0.0)
    if not rate or not epochs:
        return None
    train = manifest["splits"]["train"]
    epoch_tokens = train["tokens"]["target"] + train["examples"]  # EOS ends each target
    return DropoutStart(model.residual_dropouts(), rate, epochs, epoch_tokens, first_step,
                        start_step=t.get("dropout_from_step"))


def _early_stop_reason(best):
    s = best.state
    return (f"dev {best.metric} did not improve for {s['evaluations_without_improvement']} "
            f"evaluations (best {s['value']:.4g} at step {s['step']}, kept in "
            f"{best.directory})")


def _check_one_model(strategy, model, optimizer, step):
    """Raises TrainingError where the replicas' (a cluster's workers') copies of the weights or
    of the optimizer's state no longer hold the same numbers: they would go on as different
    models, and the checkpoints hold only replica 0's (the chief's)."""
    found = first_difference(strategy, model.weights + optimizer.variables)
    if found:
        name, replica = found
        raise TrainingError(
            f"after step {step} the replicas' copies of {name} differ (replica {replica}'s is "
            "not replica 0's): the checkpoints hold replica 0's; start the run again to resume "
            "every replica from them")


def _chief_decides(strategy, is_chief, stop):
    """The chief's early-stopping decision, on every worker (each evaluates, but the chief's
    count is the one kept on disk; workers that disagreed would wait for each other forever)."""
    if not cluster_sync.in_cluster(strategy):
        return stop
    vote = strategy.run(lambda: tf.constant(1.0 if stop and is_chief else 0.0))
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, vote, axis=None)) > 0


def _prepare_data(settings, strategy, data_dir):
    """Prepares (chief) or waits for (other workers) the TFRecords; checks that a trained
    model's vocabulary is the data's and copies the vocabulary into the model_dir. Records the
    vocabulary in `settings` (its fingerprint; the model's vocabulary sizes). Returns
    (manifest, `Vocabulary`)."""
    model_dir, d = settings["model_dir"], settings["data"]
    is_chief, _ = task_role(strategy)
    separate = d.get("separate_vocabularies", False)
    saved = read_settings(model_dir)
    # A trained model's vocabulary is its own: data rebuilt for it is tokenized with it.
    model_vocab = vocabulary.paths(model_dir, separate)
    model_fingerprint = vocabulary.readable_fingerprint(*model_vocab) if saved else None
    vocab_paths = None
    if settings.get("init_from"):  # a fine-tuned model keeps its source's vocabulary
        vocab_paths = model_vocab if model_fingerprint else \
            vocabulary.paths(settings["init_from"]["model_dir"], separate)
    elif d.get("vocab"):  # train.py --vocab: one model for both sides, or one per side
        vocab_paths = model_vocab if model_fingerprint else \
            tuple(d["vocab"]) if len(d["vocab"]) == 2 else (d["vocab"][0],) * 2
    data = dict(dataset=d["dataset"], files=d.get("files"), tfds_data_dir=d.get("tfds_data_dir"),
                vocab_size=d["vocab_size"], vocab_type=d["vocab_type"], vocab_paths=vocab_paths,
                filters=data_filters(d), separate=separate, reverse=d.get("reverse", False))
    manifest = cluster_sync.chief_first(strategy, "prepare the data", lambda: records.prepare(
        data_dir, model_vocab=model_vocab if model_fingerprint else None, **data))
    if manifest is None:  # a cluster's other worker, once the chief has prepared the data
        manifest = _prepared_by_chief(data_dir, records.data_settings(**data), data["files"])
    # Seeded again: preparing data (TFDS builds the dataset on its first use) draws Python
    # random numbers, and a seeded run must not depend on whether its data existed before.
    # Before the tokenizers: tf.random.set_seed deletes the resources of existing ones.
    keras.utils.set_random_seed(settings["train"]["seed"])
    vocab = records.manifest_vocabulary(data_dir, manifest)
    if saved:
        trained_with = model_fingerprint or saved.get("vocab_fingerprint")
        if trained_with not in (None, vocab.fingerprint):
            raise SettingsError(f"{model_dir} was trained with another vocabulary than "
                                f"{data_dir}")
    settings["vocab_fingerprint"] = vocab.fingerprint
    settings["model"].update(vocab.model_sizes())
    if is_chief:
        vocabulary.write_protos(model_dir, vocab.protos)
        # The character pairs translate.py and evaluate.py tell input in the other language by.
        side_order.keep_profiles(model_dir, settings)
    return manifest, vocab


def data_filters(data):
    """The train-split filters a run's data settings ask for (`filters.PairFilter`'s args)."""
    return {"max_length_ratio": data.get("filter_length_ratio", 0.0),
            "duplicates": data.get("filter_duplicates", False),
            "identical": data.get("filter_identical", False)}


def _describe_data(manifest, data):
    """The log line about the training data: corpora with their sampling shares, filters."""
    train = manifest["splits"]["train"]
    line = f"{train['examples']:,d} training pairs"
    if data.get("reverse"):
        line += " (reversed: the second side of each pair is the source)"
    corpora = train.get("corpora") or []
    if len(corpora) > 1:
        shares = pipeline.corpus_weights(manifest, data.get("train_weights"))
        line += " (" + ", ".join(f"{c['examples']:,d} in {c['files']} sampled {share:.0%}"
                                 for c, share in zip(corpora, shares)) + ")"
    dropped = {k: v for k, v in (train.get("filtered") or {}).items() if v}
    if dropped:
        line += "; filtered out: " + ", ".join(f"{v:,d} {k.replace('_', ' ')}"
                                               for k, v in dropped.items())
    return line


# A dev or test split this much of which the training data holds too is warned about: a few
# short common sentences ("Thank you.") are in both of many corpora.
HELD_OUT_IN_TRAIN_SHARE = 0.05
HELD_OUT_MEASURES = {"dev": "dev scores (the best checkpoint, the length penalty) reward "
                            "remembering them",
                     "test": "the test report overstates how the model translates new text"}


def _held_out_warnings(manifest):
    """Lines warning of dev and test splits whose pairs the training data holds too."""
    lines = []
    for split, count in (manifest["splits"]["train"].get("held_out") or {}).items():
        if count["pairs"] and count["in_train"] >= HELD_OUT_IN_TRAIN_SHARE * count["pairs"]:
            lines.append(f"warning: {count['in_train']:,d} of the {count['pairs']:,d} {split} "
                         "pairs are training pairs too (the same source and target): "
                         f"{HELD_OUT_MEASURES[split]}; keep them out of the training data")
    return lines


def _longer_pairs_advice(settings, checkpoint_dir):
    """How longer pairs could be kept: --max_length is the model's, so only a run that has not
    trained yet can raise it, and a learned position table holds its own length."""
    if settings.get("init_from") and settings["model"].get("position") == "learned":
        return "the learned positions of the --init_from model hold no more"
    if checkpoint_prefixes(checkpoint_dir):
        return "this run's model reads no more; a new --model_dir with a larger --max_length " \
            "keeps them"
    return "raise --max_length to keep them"


def _subword_sampler(vocab, t):
    """The run's `pipeline.SubwordSampler` (None without --subword_alpha); SettingsError where
    its vocabulary cannot be sampled from with that alpha."""
    if not t.get("subword_alpha"):
        return None
    try:
        return pipeline.SubwordSampler(vocab, t["subword_alpha"], t.get("subword_nbest", 64))
    except ValueError as error:
        raise SettingsError(f"--subword_alpha={t['subword_alpha']:g}: {error}") from None


def _check_dev_loss_measurable(manifest, max_length, best_metric, advice):
    """Raises SettingsError when the best checkpoint is chosen by a teacher-forced dev metric
    (loss, perplexity, accuracy) and --max_length leaves out every dev pair: no evaluation
    could measure it, so none would be kept as the best."""
    dev = manifest["splits"].get("dev")
    if best_metric in ("bleu", "chrf") or not dev or not dev["examples"]:
        return
    if pipeline.dropped_by_length(manifest, "dev", max_length) == dev["examples"]:
        raise SettingsError(f"--best_metric={best_metric}: max_length={max_length} leaves out "
                            f"all {dev['examples']:,d} dev pairs (more than {max_length} "
                            "subwords on a side, EOS or BOS included), so no evaluation "
                            f"measures it: {advice}, or choose --best_metric=bleu")


def _too_long(manifest, max_length, advice):
    """The log line about the pairs --max_length leaves out of training and of the dev loss
    (and `advice`), or None when it keeps them all."""
    left_out = [f"{dropped:,d} of the {manifest['splits'][split]['examples']:,d} {name} pairs"
                for split, name in (("train", "training"), ("dev", "dev"))
                if split in manifest["splits"]
                and (dropped := pipeline.dropped_by_length(manifest, split, max_length))]
    if not left_out:
        return None
    return (f"max_length={max_length} leaves out {' and '.join(left_out)} (more than "
            f"{max_length} subwords on a side, EOS or BOS included): {advice}")


def _build(settings, strategy, precision):
    """The model and its optimizer, built under the strategy in the run's precision."""
    t = settings["train"]
    keras.config.set_dtype_policy(POLICIES[precision])
    with strategy.scope():
        model = Transformer(**settings["model"])
        model.build()
        schedule = make_schedule(model.d_model, t["warmup_steps"], t["lr_scale"],
                                 t.get("lr_decay") or "rsqrt", t["train_steps"])
        optimizer = paper_adam(model.d_model, optimizer_class=PreReducedAdam, schedule=schedule)
        if precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    return model, optimizer, schedule


def _prepared_by_chief(data_dir, wanted, files):
    """The manifest of data_dir, which the chief has prepared, if it is the data of settings
    `wanted` from `files` as this worker sees them (else PreparedDataError)."""
    try:
        manifest = records.load_manifest(data_dir)
    except records.PreparedDataError as error:
        raise records.PreparedDataError(
            f"the chief has prepared the data, and this worker finds: {error} (every worker "
            "needs its --model_dir and --data_dir on a file system shared with the chief)"
            ) from None
    if not records.prepared_for(manifest, wanted, files):
        raise records.PreparedDataError(f"{data_dir} holds data prepared with other settings "
                                        "than this worker's")
    return manifest


def _format_metrics(step, metrics, weights=None):
    what = f" ({weights})" if weights else ""
    if metrics["loss"] is None:
        teacher_forced = "dev loss n/a (no dev pair within max_length)"
    else:
        teacher_forced = (f"dev loss {metrics['loss']:.3f} | ppl {metrics['perplexity']:.2f} | "
                          f"acc {metrics['accuracy']:.3f}")
    return (f"eval step {step}{what}: {teacher_forced} | sacreBLEU {metrics['bleu']:.2f} | "
            f"chrF {metrics['chrf']:.2f}")
