"""Quality cost of bf16: trains the same model twice with train.py (same seed, data and steps),
in float32 and in mixed bfloat16, and prints both dev scores and their difference as one JSON
line. About 40 minutes on 2 cores with the defaults (the main job's 1,000 steps, twice).

  python bench/precision_quality.py
  python bench/precision_quality.py --train_steps=300 --root=/tmp/precision
"""
import json
import os
import re
import subprocess
import sys
import time

from common import ROOT

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("root", "runs/precision", "Parent directory of the two model_dirs.")
flags.DEFINE_integer("train_steps", 1000, "Steps of each run (train.py's default).")
flags.DEFINE_string("data_dir", "runs/bench-data", "Prepared data shared by both runs.")

SCORES = re.compile(r"eval step (\d+).*dev loss ([\d.]+) \| ppl ([\d.]+) \| acc ([\d.]+) \| "
                    r"sacreBLEU ([\d.]+) \| chrF ([\d.]+)")


def train(precision):
    model_dir = os.path.join(FLAGS.root, precision)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                          f"--model_dir={model_dir}", f"--data_dir={FLAGS.data_dir}",
                          f"--mixed_precision={precision}", f"--train_steps={FLAGS.train_steps}",
                          f"--eval_every={FLAGS.train_steps}"],
                         check=True, capture_output=True, text=True).stdout
    step, loss, ppl, acc, bleu, chrf = SCORES.findall(out)[-1]
    return {"step": int(step), "dev_loss": float(loss), "perplexity": float(ppl),
            "accuracy": float(acc), "bleu": float(bleu), "chrf": float(chrf),
            "minutes": round((time.perf_counter() - start) / 60, 1)}


def main(argv):
    del argv
    result = {"none": train("none"), "bf16": train("bf16")}
    result["bleu_bf16_minus_fp32"] = round(result["bf16"]["bleu"] - result["none"]["bleu"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
