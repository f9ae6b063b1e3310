"""What training writes for TensorBoard: scalars grouped by what they are about (each with a
description), the run's settings for the HParams tab, attention heatmaps, and the RSS gauge.

Tags: metrics/ (loss in both the train and eval runs, so one chart shows both; dev perplexity,
accuracy, bleu, chrf), optim/ (learning rate, gradient norm), system/ (speed, memory, padding),
samples/translations (text) and samples/attention/<kind>/layer_<i> (images), so that the
scalars come first in TensorBoard's alphabetical list of groups.
"""
import os
import time

import tensorflow as tf

from tfnmt.data.special_tokens import BOS_ID
from tfnmt.data.tokenizer import padded_with_ends
from tfnmt.training.attention_images import labelled_heads

# name -> (TensorBoard tag, description).
SCALARS = {
    "loss": ("metrics/loss", "Label-smoothed cross-entropy per real target token: train, over "
             "the updates since the last point; eval, over the dev split."),
    "perplexity": ("metrics/perplexity", "exp of the unsmoothed cross-entropy per target "
                   "token on the dev split (teacher forcing)."),
    "accuracy": ("metrics/accuracy", "Share of dev target tokens that are the model's most "
                 "likely next token, teacher-forced."),
    "bleu": ("metrics/bleu", "sacreBLEU (13a) of the detokenized dev translations (greedy, or "
             "beam with --eval_beam_size). Few points: set smoothing to 0."),
    "chrf": ("metrics/chrf", "sacreBLEU chrF of the same dev translations."),
    "learning_rate": ("optim/learning_rate", "Adam's learning rate (--lr_decay schedule)."),
    "grad_norm": ("optim/grad_norm", "Global norm of the update's gradient, before clipping; "
                  "mean over the updates since the last point."),
    "tokens_per_sec": ("system/target_tokens_per_sec", "Real (not padding) target tokens "
                       "trained per second of training; evaluation time left out."),
    "rss_gib": ("system/rss_gib", "Resident memory of the training process, GiB."),
    "padding_fraction": ("system/padding_fraction", "Share of the batches' positions (source "
                         "and target) that are padding."),
}


def mark_run_start(writer, step):
    """Marks in `writer`'s event file that a run (new or resumed) starts at `step`. A run
    stopped after its last checkpoint logged steps that the resumed run logs again; without
    the mark, TensorBoard's Python loader (`--load_fast=false`, or where its Rust data server is
    missing) shows both, a second curve doubling back. At a SessionLog.START event it drops the
    points of earlier files at the event's step and later, but it takes the first START it reads
    in a run for the run's own start, so the mark is written twice. (The Rust data server keeps
    the newest point of each step either way.)

    Args:
      writer: a file writer (`tf.summary.create_file_writer`).
      step: the first step the run will log.
    """
    from tensorflow.core.util import event_pb2
    from tensorflow.python.ops import summary_ops_v2

    event = event_pb2.Event(step=step, wall_time=time.time(),
                            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
    with writer.as_default():
        for _ in range(2):
            summary_ops_v2.import_event(tf.constant(event.SerializeToString()))
    writer.flush()


def write_scalars(values, step):
    """Writes scalars under their tags with their descriptions (inside a summary writer).

    Args:
      values: {name in SCALARS: number, or None for one not measured (left out)}.
      step: the summary step.
    """
    for name, value in values.items():
        if value is None:
            continue
        tag, description = SCALARS[name]
        tf.summary.scalar(tag, value, step=step, description=description)


def write_hparams(model_dir, settings):
    """Writes the run's settings for TensorBoard's HParams tab (runs compared by their settings
    and their metrics/ scalars), in an event file of the model_dir itself, replacing the one
    written before: TensorBoard shows a run's first settings only, and they change (a time
    budget's plan, a resumed run's --train_steps).

    Args:
      model_dir: the run's directory.
      settings: the run's settings (model, data, train sections).
    """
    from tensorboard.plugins.hparams import api as hparams_api

    values = {f"{section}.{key}": value for section in ("model", "data", "train")
              for key, value in sorted((settings.get(section) or {}).items())
              if isinstance(value, (bool, int, float, str))}
    values["preset"] = settings.get("preset") or ""
    # The model_dir's own event files hold these settings only (summaries go to train/, eval/).
    for old in tf.io.gfile.glob(os.path.join(model_dir, "events.out.tfevents.*")):
        tf.io.gfile.remove(old)
    with tf.summary.create_file_writer(model_dir).as_default() as writer:
        hparams_api.hparams(values, trial_id=os.path.basename(os.path.abspath(model_dir)))
        writer.flush()


def teacher_forced_inputs(source_ids, target, max_length):
    """A sentence pair as the inputs of `attention_weights`, within `max_length` positions (a
    learned position table has no more rows).

    Args:
      source_ids: [1, S] the source's model inputs.
      target: [1, None] ragged target subword ids (no BOS).
      max_length: the positions either side may take.

    Returns:
      (source_ids [1, <= max_length], target_in [1, <= max_length] starting with BOS).
    """
    return (source_ids[:, :max_length],
            padded_with_ends(target[:, :max_length - 1], start_id=BOS_ID))


def attention_weights(model, source_ids, target_in):
    """Every layer's attention of one sentence pair, teacher-forced.

    Args:
      model: a `Transformer`.
      source_ids: [1, S].
      target_in: [1, T], starting with BOS.

    Returns:
      {name: [H, Tq, Tk]} for the encoder self, decoder self and decoder cross attention of
      each layer.
    """
    memory, padding, encoder = model.encode(source_ids, training=False,
                                            return_attention_scores=True)
    _, decoder = model.decode(target_in, memory, padding, training=False,
                              return_attention_scores=True)
    maps = {}
    for i, w in enumerate(encoder):
        maps[f"encoder_self/layer_{i}"] = w[0].numpy()
    for i, w in enumerate(decoder):
        maps[f"decoder_self/layer_{i}"] = w["self"][0].numpy()
        maps[f"decoder_cross/layer_{i}"] = w["cross"][0].numpy()
    return maps


def attention_pictures(model, source_ids, target_in, source_id_to_piece, target_id_to_piece):
    """Every layer's attention of one sentence pair as labelled pictures (`labelled_heads`).

    Args:
      model, source_ids, target_in: as for `attention_weights` (one sentence, no padding).
      source_id_to_piece, target_id_to_piece: map an int32 id tensor to a tf.string tensor of
        pieces of each side's vocabulary (a `Tokenizer`'s `id_to_piece`, a tf-text
        SentencepieceTokenizer's `id_to_string`).

    Returns:
      {name: [height, width, 3] uint8}, names as in `attention_weights`.
    """
    def pieces(ids, id_to_piece):
        return [p.decode("utf-8", "replace") for p in id_to_piece(ids[0]).numpy()]

    source = pieces(source_ids, source_id_to_piece)
    target = pieces(target_in, target_id_to_piece)
    tokens = {"encoder_self": (source, source), "decoder_self": (target, target),
              "decoder_cross": (target, source)}
    return {name: labelled_heads(weights, *tokens[name.split("/")[0]])
            for name, weights in attention_weights(model, source_ids, target_in).items()}


def write_attention_images(model, source_ids, target_in, step, vocabulary):
    """Writes one image summary per layer and attention kind (call inside a summary writer),
    with the sentence's pieces on the axes.

    Args:
      model, source_ids, target_in: as for `attention_weights` (one sentence, no padding).
      step: the summary step.
      vocabulary: the `vocabulary.Vocabulary` whose pieces label the axes.
    """
    for name, image in attention_pictures(model, source_ids, target_in,
                                          vocabulary.source.id_to_piece,
                                          vocabulary.target.id_to_piece).items():
        tf.summary.image(f"samples/attention/{name}", image[None], step=step,
                         description="Each head's attention weights on one dev sentence "
                         "(scaled to the head's maximum): rows are the queries, columns the "
                         "keys they attend to.")


def rss_bytes():
    """Resident set size of this process (0 where /proc is not available)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
