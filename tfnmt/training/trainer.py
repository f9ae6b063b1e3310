"""The training loop: a tf.function over `strategy.run`, with gradient accumulation, loss
normalised by the global number of target tokens, and checkpoints that survive a kill."""
import logging
import math
import os
import time

import numpy as np
import tensorflow as tf

from tfnmt import fast_ops
from tfnmt.checkpoints import ModelDirError, remove_interrupted_saves, repair_checkpoint_state
from tfnmt.data.special_tokens import PAD_ID
from tfnmt.paths import checkpoint_prefixes
from tfnmt.training.losses import masked_loss_sum, masked_projected_loss_sum
from tfnmt.training.stop_signals import TrainingInterrupted

SUM = tf.distribute.ReduceOp.SUM
# fp16 loss scaling halves the scale at each skipped update: this many in a row is divergence.
MAX_SKIPPED_IN_A_ROW = 64
# A checkpoint's budget_seconds when no time budget is being planned.
NO_BUDGET = -1.0
BUDGET_KEY = "budget_seconds/.ATTRIBUTES/VARIABLE_VALUE"


class TrainingError(RuntimeError):
    """Training cannot go on (the checkpoints written so far are kept)."""


class Trainer:
    """One optimizer update per `train_step`, over `accum_steps` micro-batches per replica.

    Every replica sums the smoothed loss over its real target tokens and divides by the number
    of real target tokens in the *whole* global batch (all replicas, all micro-batches), so the
    summed gradient is the gradient of the global per-token mean, whatever the replica count or
    accumulation. Gradients are all-reduced here, once (see PreReducedAdam).

    Args:
      model: a built `Transformer`, created under `strategy.scope()`.
      optimizer: a built `PreReducedAdam` (or a `LossScaleOptimizer` around one).
      strategy: the `tf.distribute` strategy the model and optimizer live in.
      label_smoothing: the loss's label smoothing (paper: 0.1).
      accum_steps: micro-batches per replica per update.
      jit_compile: compile each replica's forward and backward passes with XLA.
      clip_norm: scale the update's gradients down to this global norm when it is larger
        (0: no clipping). The reported norm is the one before clipping.

    Example:
      trainer = Trainer(model, optimizer, strategy)
      trainer(iterator, train_steps=1000, keeper=keeper, stats=stats)  # the loop
      outputs = trainer.train_step(iterator)                           # or one update
    """

    def __init__(self, model, optimizer, strategy, label_smoothing=0.1, accum_steps=1,
                 jit_compile=False, clip_norm=0.0):
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.label_smoothing = label_smoothing
        self.accum_steps = accum_steps
        self.clip_norm = clip_norm
        self.jit_compile = jit_compile
        self.retrace()

    def retrace(self):
        """A new trace of the train step at its next call (after a change to what the trace
        holds as constants, such as a dropout rate)."""
        # XLA compiles a replica's forward and backward passes, which talk to no other replica:
        # with the all-reduce and the mirrored variables' update inside, the compiled step
        # failed at its first update under MirroredStrategy. autograph=False here and on every
        # tfnmt tf.function: their loops and branches are written as tf.while_loop/tf.cond,
        # and converting the code they call cost ~5 s per process.
        self.local_gradients = tf.function(self._local_gradients, jit_compile=True,
                                           autograph=False) \
            if self.jit_compile else self._local_gradients
        self.train_step = tf.function(self._train_step, autograph=False)

    def __call__(self, iterator, train_steps, keeper=None, stats=None, evaluate=None,
                 log_every=100, checkpoint_every=1000, eval_every=0, budget=None,
                 on_plan=None, after_update=None, stop=None):
        """Runs updates until the optimizer has applied `train_steps` (or `evaluate` stops
        it); returns the update count reached.

        Args:
          iterator: a distributed iterator over training batches (it never ends).
          train_steps: the optimizer update count to stop at.
          keeper: a `CheckpointKeeper`, saved every `checkpoint_every` updates and at the end.
          stats: a `TrainingStats`, reported every `log_every` updates and at the end.
          evaluate: called with the step every `eval_every` updates (not at the end); its time
            is left out of the reported speed. When it returns True (early stopping), the
            loop saves a checkpoint and stops there.
          budget: a `budget.TrainingBudget`: after each update it may plan a new last update,
            which replaces `train_steps` and is passed to `on_plan`.
          after_update: called with the step and the update's outputs (floats) after each applied
            update, before the budget plans.
          stop: a `stop_signals.StopSignals`: once it has received a signal, the loop saves
            the update it just applied and raises TrainingInterrupted.

        Raises:
          TrainingError: an applied update's loss or gradient norm is not finite (the loss has
            diverged; that update is not saved), or fp16 loss scaling skipped more than
            MAX_SKIPPED_IN_A_ROW updates in a row.
          TrainingInterrupted: `stop` received a signal.
        """
        step = int(self.optimizer.iterations.numpy())
        streak = 0
        while step < train_steps:
            # Read once (the host waits for the update here anyway): the log, the hooks and
            # the divergence check below take floats.
            outputs = {k: float(v) for k, v in self.train_step(iterator).items()}
            if stats is not None:
                stats.update(outputs)
            # Steps count applied updates: with fp16 loss scaling an overflowing update is
            # skipped (and the scale lowered), so the optimizer's count is the truth.
            applied = int(self.optimizer.iterations.numpy())
            if applied == step:
                streak += 1
                if stats is not None:
                    stats.skipped += 1
                if streak > MAX_SKIPPED_IN_A_ROW:  # the scale is ~2^-50 by now: no overflow
                    raise TrainingError(
                        f"step {step + 1}: {streak} updates in a row had non-finite gradients "
                        "at every loss scale; the loss has diverged (lower --lr_scale or use "
                        "--mixed_precision=bf16|none)")
                continue
            step, streak = applied, 0
            # A non-finite loss or gradient: the weights are (or will be) NaN. Stop before this
            # update is saved, or the checkpoints kept would rotate the good ones away.
            loss, grad_norm = outputs["loss"], outputs["grad_norm"]
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                newest = keeper.newest() if keeper is not None else None
                raise TrainingError(
                    f"step {step}: loss {loss}, gradient norm {grad_norm}: training has "
                    f"diverged; this update was not saved, and the checkpoints before it are "
                    f"kept (newest: {newest or 'none'}). Resume with --clip_norm (e.g. 1.0), "
                    "or train a new --model_dir with a lower --lr_scale")
            if after_update is not None:
                after_update(step, outputs)
            planned = budget.plan(step) if budget is not None else None
            if planned is not None:
                train_steps = planned
                if on_plan is not None:
                    on_plan(planned)
            if stats is not None and (step % log_every == 0 or step == train_steps):
                stats.report(step, float(self.optimizer.learning_rate))
            if keeper is not None and (step % checkpoint_every == 0 or step == train_steps):
                keeper.save(step)
            if evaluate is not None and eval_every and step % eval_every == 0 \
                    and step < train_steps:
                # The monotonic clock, as the budget's: the wall clock moves by a suspended
                # laptop's hours or a clock step, which would be taken out of training time.
                start = time.monotonic()
                stop_early = evaluate(step)
                seconds = time.monotonic() - start
                if stats is not None:
                    stats.pause(seconds)
                if budget is not None:
                    budget.pause(seconds)
                if stop_early:
                    if keeper is not None and step % checkpoint_every != 0:
                        keeper.save(step)
                    break
            if stop is not None and stop.received:
                saved = None
                if keeper is not None:  # saved above at a checkpoint step or the last one
                    just_saved = step % checkpoint_every == 0 or step == train_steps
                    saved = keeper.newest() if just_saved else keeper.save(step)
                raise TrainingInterrupted(stop.received, step, saved)
        return step

    def replica_gradients(self, batches):
        """This replica's part of one update (call inside `strategy.run`).

        Args:
          batches: this replica's micro-batches.

        Returns:
          (summed loss, real target tokens, padded positions, gradients of the global per-token mean
          loss, already summed over replicas).
        """
        context = tf.distribute.get_replica_context()
        local_tokens = tf.add_n([tf.reduce_sum(tf.cast(tf.not_equal(b["target_out"], PAD_ID),
                                                       tf.float32)) for b in batches])
        global_tokens = tf.maximum(context.all_reduce(SUM, local_tokens), 1.0)
        loss_sum, padded, grads = self.local_gradients(batches, global_tokens)
        grads = context.all_reduce(SUM, grads)
        return loss_sum, local_tokens, padded, grads

    def _local_gradients(self, batches, global_tokens):
        """This replica's forward and backward passes over its micro-batches, with no
        cross-replica work (XLA compiles this with `jit_compile`).

        Args:
          batches: this replica's micro-batches.
          global_tokens: real target tokens in the whole global batch (float32 scalar).

        Returns:
          (summed loss, padded positions, gradients of this replica's share of the global
          per-token mean loss).
        """
        variables = self.model.trainable_variables
        grads, loss_sum, padded = None, 0.0, 0.0
        for batch in batches:
            with tf.GradientTape() as tape:
                batch_loss = self._loss_sum(batch)
                scaled = self.optimizer.scale_loss(batch_loss / global_tokens)
            step_grads = [dense_gradient(g, v) for g, v in
                          zip(tape.gradient(scaled, variables), variables)]
            grads = step_grads if grads is None else [a + b for a, b in zip(grads, step_grads)]
            loss_sum += batch_loss
            padded += tf.cast(tf.size(batch["source"]) + tf.size(batch["target_in"]), tf.float32)
        return loss_sum, padded, grads

    def _loss_sum(self, batch):
        """The batch's summed smoothed loss over its real target tokens."""
        if not fast_ops.enabled():
            logits = self.model((batch["source"], batch["target_in"]), training=True)
            return masked_loss_sum(batch["target_out"], logits, self.label_smoothing)[0]
        memory, source_padding = self.model.encode(batch["source"], training=True)
        states, _ = self.model.decoder_states(batch["target_in"], memory, source_padding,
                                              training=True)
        # The output projection happens inside the loss (fewer passes over the logits), on
        # the real target positions only, unless XLA needs static shapes.
        return masked_projected_loss_sum(batch["target_out"], states,
                                         self.model.output_kernel(), self.label_smoothing,
                                         real_rows_only=not self.jit_compile)[0]

    def _replica_step(self, batches):
        loss_sum, tokens, padded, grads = self.replica_gradients(batches)
        # With fp16 loss scaling the gradients are scaled; the norm is reported unscaled.
        scale = tf.cast(getattr(self.optimizer, "dynamic_scale", 1.0), tf.float32)
        grad_norm = tf.linalg.global_norm(grads) / scale
        if self.clip_norm:  # on the summed global gradient, so the same on every replica
            factor = tf.minimum(1.0, self.clip_norm / tf.maximum(grad_norm, 1e-30))
            grads = [g * factor for g in grads]
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        source_tokens = tf.add_n([tf.reduce_sum(tf.cast(tf.not_equal(b["source"], PAD_ID),
                                                        tf.float32)) for b in batches])
        return {"loss_sum": loss_sum, "tokens": tokens, "padded": padded,
                "real": tokens + source_tokens,  # target_in has as many real ids as target_out
                "grad_norm": grad_norm}

    def _train_step(self, iterator):
        batches = [next(iterator) for _ in range(self.accum_steps)]
        out = self.strategy.run(self._replica_step, args=(batches,))
        totals = {k: self.strategy.reduce(SUM, out[k], axis=None)
                  for k in ("loss_sum", "tokens", "padded", "real")}
        return {"loss": totals["loss_sum"] / tf.maximum(totals["tokens"], 1.0),
                "target_tokens": totals["tokens"],
                "padding_fraction": 1.0 - totals["real"] / tf.maximum(totals["padded"], 1.0),
                "grad_norm": self.strategy.reduce(tf.distribute.ReduceOp.MEAN, out["grad_norm"],
                                                  axis=None)}


def dense_gradient(gradient, variable):
    """A variable's gradient as a dense tensor. Embedding lookups give tf.IndexedSlices whose rows
    repeat (the encoder and decoder gather from one position table; a batch repeats tokens):
    summed here into one row per index, so that micro-batches can be added, Adam squares the
    summed gradient ((Σg)², not Σg²), and the global norm is the true one.

    Args:
      gradient: a tensor, tf.IndexedSlices or None (an unused variable).
      variable: the variable.

    Returns:
      A dense tensor of the variable's shape (zeros for None).
    """
    if gradient is None:
        return tf.zeros_like(variable)
    if isinstance(gradient, tf.IndexedSlices):
        return tf.math.unsorted_segment_sum(gradient.values, gradient.indices,
                                            tf.shape(variable)[0])
    return gradient


class CheckpointKeeper:
    """tf.train.CheckpointManager over model + optimizer, restoring the newest checkpoint that
    reads back; a corrupt or half-written newest one is skipped with a warning. It repairs the
    directory first (state file, interrupted saves): use it as the directory's one writer
    (experiment.run holds a DirectoryLock).

    A checkpoint also holds `budget_seconds`: the training seconds spent of a time budget
    (`budget.TrainingBudget`) whose plan was still being revised at the save, else -1 (no
    budget, or its plan stays), so that a resumed run can go on planning from there.

    Args:
      directory: the checkpoint directory.
      model, optimizer: what a checkpoint holds.
      keep: checkpoints kept (older ones are deleted).
      resume_from: a cluster worker's keeper: the chief's checkpoint directory, which it
        restores from and names as the newest; its own saves are removed once written (every
        process takes part in a save, as Keras' ModelCheckpoint has its workers write
        temporary files).
    """

    def __init__(self, directory, model, optimizer, keep=5, resume_from=None):
        # The checkpoint files are the truth: a damaged state file is rebuilt from them first
        # (else the manager would see no checkpoint, start over and rotate the run away).
        repair = repair_checkpoint_state(directory)
        if repair:
            logging.warning("%s", repair)
        for path in remove_interrupted_saves(directory):
            logging.warning("removed %s, left by an interrupted save", path)
        self.resume_from = resume_from
        self.budget, self.restored_budget_seconds = None, None
        self.budget_seconds = tf.Variable(NO_BUDGET, dtype=tf.float64, trainable=False)
        # Read without budget_seconds, so that checkpoints written before they held it match.
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        saved = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                    budget_seconds=self.budget_seconds)
        self.manager = tf.train.CheckpointManager(saved, directory, max_to_keep=keep,
                                                  step_counter=optimizer.iterations,
                                                  checkpoint_name="ckpt")

    def restore(self):
        """Restores the newest good checkpoint (of `resume_from` where given); returns its
        path, or None to start fresh. `restored_budget_seconds` is then its training seconds
        of a time budget still being planned, else None (no budget, its plan stayed, or a
        checkpoint without the value)."""
        paths = self.manager.checkpoints if self.resume_from is None else \
            checkpoint_prefixes(self.resume_from)
        for path in reversed(paths):
            try:
                self.checkpoint.read(path).assert_existing_objects_matched().expect_partial()
                reader = tf.train.load_checkpoint(path)
                seconds = float(reader.get_tensor(BUDGET_KEY)) \
                    if reader.has_tensor(BUDGET_KEY) else NO_BUDGET
                self.restored_budget_seconds = seconds if seconds >= 0 else None
                return path
            except (tf.errors.OpError, ValueError, AssertionError, IndexError, KeyError) as error:
                logging.warning("checkpoint %s does not read back (%s); trying the previous one",
                                path, str(error).splitlines()[0][:200])
        if paths:
            directory = self.resume_from or self.manager.directory
            raise ModelDirError(f"no checkpoint in {directory} reads back; none was changed "
                                "(move them away to start this run over)")
        return None

    def save(self, step):
        """Saves a checkpoint, with the training seconds of `self.budget` if its plan is
        still being revised.

        Args:
          step: its number (the optimizer's update count).

        Returns:
          The checkpoint's path (removed already with `resume_from`).
        """
        revising = self.budget is not None and not self.budget.frozen
        self.budget_seconds.assign(self.budget.elapsed() if revising else NO_BUDGET)
        path = self.manager.save(checkpoint_number=step)
        if self.resume_from is not None:
            for name in tf.io.gfile.glob(path + ".*") + [
                    os.path.join(self.manager.directory, "checkpoint")]:
                tf.io.gfile.remove(name)
        return path

    def newest(self):
        """The newest checkpoint a run started again would resume from, or None."""
        if self.resume_from is None:
            return self.manager.latest_checkpoint
        prefixes = checkpoint_prefixes(self.resume_from)
        return prefixes[-1] if prefixes else None


def average_checkpoints(model, paths, output_prefix):
    """Checkpoint averaging (paper §6.1: the last 5 checkpoints for base, 20 for big).

    Args:
      model: a built model of the checkpoints' kind; its weights become the average.
      paths: checkpoint prefixes.
      output_prefix: where to write the averaged checkpoint.

    Returns:
      The written checkpoint's path.
    """
    variables = model.trainable_variables
    sums = [np.zeros(v.shape, np.float64) for v in variables]
    for path in paths:
        tf.train.Checkpoint(model=model).read(path).expect_partial()
        for total, variable in zip(sums, variables):
            total += variable.numpy()
    for total, variable in zip(sums, variables):
        variable.assign((total / len(paths)).astype(variable.dtype))
    return tf.train.Checkpoint(model=model).write(output_prefix)
