"""The peer on this machine: OpenNMT-tf 2.32 trained and decoded on the same corpus, vocabulary
and model size as `python bench/train.py` and `python bench/decode.py`, for same-machine ratios.

OpenNMT-tf 2.32 needs TensorFlow 2.13 (and TF Addons), which cannot share an environment with
this project's TensorFlow 2.21; install it in its own virtual environment and pass its python:

  python -m venv /tmp/onmt && /tmp/onmt/bin/pip install OpenNMT-tf==2.32.0 tensorflow==2.13.1
  python bench/opennmt_peer.py --onmt_python=/tmp/onmt/bin/python              # training speed
  python bench/opennmt_peer.py --onmt_python=/tmp/onmt/bin/python --steps=1000 --decode
  python bench/opennmt_peer.py --onmt_python=/tmp/onmt/bin/python --notrain --decode  # again

The corpus is the embedded train split tokenized with the bench's own 8k SentencePiece model
(runs/bench-data/spm.model); the model has the shape of tfnmt's --preset (`small`: d_model 256,
3+3 layers, 4 heads, d_ff 1024; `base`: the paper's 512, 6+6, 8, 2,048) and its LayerNorm
placement (post-norm for both, as tfnmt's; OpenNMT-tf's own default is pre-norm), shared
embeddings and softmax, dropout 0.1 on residuals and embeddings only, 4,096-token batches with
width-1 length buckets, Adam + Noam warm-up 4,000, label smoothing 0.1. OpenNMT-tf enables
mixed precision only on GPUs, so `--mixed_precision=bf16` sets Keras's global mixed_bfloat16
policy before it starts.

Training speed is the median of OpenNMT-tf's own "target" tokens/s log lines after the first
--skip_logs. With --decode, the trained checkpoint then translates the test split with
`onmt-main infer` (beam 4, batch 32, float32, its --log_prediction_time figures) and the
pieces of its outputs are counted and scored with sacreBLEU; --notrain decodes the model an
earlier run left in --work_dir again, without training. Prints one JSON line.
"""
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import time

from common import (PEER_LAUNCHER, cpu_description, peer_environment,
                    peer_model_script, prepared_data)
from tfnmt import paths  # noqa: E402
from tfnmt.model.presets import PRESETS  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("peer_malloc", "system", ["system", "tcmalloc"], "C allocator of the "
                  "OpenNMT-tf processes: system (glibc, what its users get; default) or tcmalloc.")
flags.DEFINE_string("onmt_python", None, "Python of an environment with OpenNMT-tf 2.32.")
flags.DEFINE_string("data_dir", "runs/bench-data", "Prepared embedded corpus (made if missing).")
flags.DEFINE_string("work_dir", "runs/opennmt-peer", "Its data, config and model (the model "
                    "is trained anew each run).")
flags.DEFINE_enum("preset", "small", ["small", "base"], "tfnmt preset whose model shape the "
                  "peer trains (bench/train.py --preset); default small.")
flags.DEFINE_integer("steps", 300, "Training steps.")
flags.DEFINE_integer("log_every", 20, "Steps per OpenNMT-tf log line (one timing window).")
flags.DEFINE_integer("skip_logs", 3, "Log lines left out as warm-up.")
flags.DEFINE_enum("mixed_precision", "bf16", ["bf16", "none"], "Training compute dtype.")
flags.DEFINE_bool("decode", False, "Translate the test split after training and time it.")
flags.DEFINE_bool("train", True, "Train (anew). --notrain --decode: only decode the model an "
                  "earlier run left in --work_dir.")
flags.mark_flag_as_required("onmt_python")

CONFIG = """model_dir: {work}/model
data:
  train_features_file: {work}/train.de
  train_labels_file: {work}/train.en
  source_vocabulary: {work}/vocab.txt
  target_vocabulary: {work}/vocab.txt
params:
  optimizer: Adam
  optimizer_params: {{beta_1: 0.9, beta_2: 0.98, epsilon: 1.0e-9}}
  learning_rate: 2.0
  decay_type: NoamDecay
  decay_params: {{model_dim: {d_model}, warmup_steps: 4000}}
  label_smoothing: 0.1
  beam_width: 4
  num_hypotheses: 1
train:
  batch_size: 4096
  batch_type: tokens
  effective_batch_size: null
  length_bucket_width: 1
  maximum_features_length: 256
  maximum_labels_length: 256
  sample_buffer_size: -1
  save_checkpoints_steps: {steps}
  max_step: {steps}
  save_summary_steps: {log_every}
infer:
  batch_size: 32
  batch_type: examples
  length_bucket_width: 5
"""

LOG_LINE = re.compile(r"Step = (\d+) ; steps/s = [\d.]+, tokens/s = \d+ "
                      r"\(\d+ source, (\d+) target\)")


def write_data(work, spm_path):
    """Train and test splits as space-separated pieces of the bench's SentencePiece model, and
    the raw test references for sacreBLEU."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    for split in ("train", "test"):
        with gzip.open(os.path.join(paths.EMBEDDED_DIR, f"{split}.tsv.gz"), "rt",
                       encoding="utf-8") as tsv, \
                open(os.path.join(work, f"{split}.de"), "w", encoding="utf-8") as de, \
                open(os.path.join(work, f"{split}.en"), "w", encoding="utf-8") as en:
            references = []
            for line in tsv:
                source, target = line.rstrip("\n").split("\t")[:2]
                de.write(" ".join(processor.encode(source, out_type=str)) + "\n")
                en.write(" ".join(processor.encode(target, out_type=str)) + "\n")
                references.append(target + "\n")
        if split == "test":
            with open(os.path.join(work, "test.raw.en"), "w", encoding="utf-8") as raw:
                raw.writelines(references)
    with open(os.path.join(work, "spm.vocab"), "w", encoding="utf-8") as vocab:
        for index in range(processor.get_piece_size()):
            vocab.write(f"{processor.id_to_piece(index)}\t{processor.get_score(index)}\n")


def run(args, env=None, log_path=None):
    with open(log_path, "w") as log:
        subprocess.run([FLAGS.onmt_python, *args], check=True, stdout=log,
                       stderr=subprocess.STDOUT,
                       env=peer_environment(FLAGS.peer_malloc, **(env or {})))
    with open(log_path) as log:
        return log.read()


def main(argv):
    del argv
    work = os.path.abspath(FLAGS.work_dir)
    launcher = [os.path.join(work, "launcher.py"), "--model", os.path.join(work, "model.py"),
                "--config", os.path.join(work, "config.yml")]
    result = {"machine": cpu_description(), "peer": "OpenNMT-tf 2.32 (TensorFlow 2.13)",
              "peer_malloc": FLAGS.peer_malloc}
    if FLAGS.train:
        result.update(train(work, launcher))
    elif not FLAGS.decode:
        raise app.UsageError("--notrain without --decode does nothing")
    elif not os.path.isdir(os.path.join(work, "model")):
        raise app.UsageError(f"--notrain: no model in {work}/model; train one first")
    if FLAGS.decode:
        result["decode"] = decode(work, launcher)
    print(json.dumps(result))


def train(work, launcher):
    """Trains anew in `work`: -> its training-speed figures."""
    manifest = prepared_data(FLAGS.data_dir)
    shutil.rmtree(os.path.join(work, "model"), ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    write_data(work, os.path.join(FLAGS.data_dir, manifest["vocab"]["file"]))
    run(["-m", "opennmt.bin.build_vocab", "--from_vocab", os.path.join(work, "spm.vocab"),
         "--from_format", "sentencepiece", "--save_vocab", os.path.join(work, "vocab.txt")],
        log_path=os.path.join(work, "vocab.log"))
    shape = PRESETS[FLAGS.preset]
    for name, text in (("model.py", peer_model_script(shape, shape["dropout"])),
                       ("launcher.py", PEER_LAUNCHER),
                       ("config.yml", CONFIG.format(work=work, steps=FLAGS.steps,
                                                    log_every=FLAGS.log_every, **shape))):
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    policy = {"bf16": "mixed_bfloat16", "none": ""}[FLAGS.mixed_precision]
    train_log = run([*launcher, "train"], env={"PEER_POLICY": policy},
                    log_path=os.path.join(work, "train.log"))
    windows = [int(target) for _, target in LOG_LINE.findall(train_log)][FLAGS.skip_logs:]
    if not windows:
        raise RuntimeError(f"no timing lines after warm-up in {work}/train.log")
    return {"preset": FLAGS.preset, "mixed_precision": FLAGS.mixed_precision,
            "steps": FLAGS.steps, "target_tokens_per_s": statistics.median(windows),
            "window_target_tokens_per_s": windows}


def decode(work, launcher):
    """Translates the test split with the model in `work`: -> its decoding figures."""
    import sacrebleu

    predictions = os.path.join(work, "test.pred.en")
    start = time.perf_counter()
    infer_log = run([*launcher, "infer", "--features_file", os.path.join(work, "test.de"),
                     "--predictions_file", predictions, "--log_prediction_time"],
                    log_path=os.path.join(work, "infer.log"))
    wall = time.perf_counter() - start
    with open(predictions, encoding="utf-8") as f:
        outputs = [line.split() for line in f]
    with open(os.path.join(work, "test.raw.en"), encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f]
    detokenized = ["".join(pieces).replace("\u2581", " ").strip() for pieces in outputs]
    seconds = re.search(r"Total prediction time \(s\): ([\d.]+)", infer_log)
    result = {
        "beam": 4, "batch": 32, "sentences": len(outputs),
        "target_pieces": sum(len(pieces) for pieces in outputs),
        "prediction_seconds": float(seconds.group(1)) if seconds else None,
        "process_wall_seconds": round(wall, 1),
        "sacrebleu": round(sacrebleu.corpus_bleu(detokenized, [references]).score, 2)}
    if seconds:
        result["target_tokens_per_s"] = round(result["target_pieces"]
                                              / result["prediction_seconds"], 1)
        result["sentences_per_s"] = round(len(outputs) / result["prediction_seconds"], 2)
    return result


if __name__ == "__main__":
    app.run(main)
