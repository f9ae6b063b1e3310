"""Translation quality per minute of this CPU: tfnmt's main job against OpenNMT-tf 2.32, each
trained for the same wall-clock budget on the same machine, one after the other, on the same
corpus, SentencePiece model and model size; both scored on the test split with beam 4 and the
same length penalty (GNMT, alpha 0.6) by sacreBLEU.

  python -m venv /tmp/onmt && /tmp/onmt/bin/pip install OpenNMT-tf==2.32.0 tensorflow==2.13.1
  pip install -r bench/requirements.txt                          # matplotlib, for the plot
  python bench/quality.py --onmt_python=/tmp/onmt/bin/python --minutes=15,30,60 \\
      --mixed_precision=none

Minutes are measured from each training process' start: tfnmt's count its start-up and its
data preparation (SentencePiece training, TFRecords), as the main job's do; the peer is given
the pieces of tfnmt's SentencePiece model, prepared outside its budget.

tfnmt trains as its main job does: for a time (`--train_minutes`), planning its number of
updates from its own pace as it goes, again once its late dropout starts
(`training/budget.py`). It is given the budget less its start-up (data preparation, model
building, tracing: measured on a calibration run of --calibration_minutes), less
--tfnmt_margin of that for its last checkpoint.
A peer recipe whose learning rate falls to zero at its last step (`budgeted`: OpenNMT-tf's
CosineAnnealing with tfnmt's warm-up and peak) is trained once per budget, for the number of
steps that fits the budget: the first budget is planned from the pace of a calibration run
(--calibration_minutes, one per dropout rate and tokenization) on this machine, each later one
from the run before it; a run that ends well before its budget (`--replan_unused`) is trained
again, planned from its own pace. A run still going at its budget is stopped there and its
last checkpoint scored (`"cut": true`); `"planned_from"` lists the paces used. A recipe of open
length (the peer's `noam` recipes) trains once, for the largest budget, and the checkpoint saved
last before each budget is scored; its checkpoints every --checkpoint_minutes draw its curve.

`--tfnmt_flags` gives tfnmt's runs more train.py flags (e.g. `--subword_alpha=0.1`, subword
regularization), and the peer's `budgeted_sampled` recipe samples segmentations the same way with
OpenNMT-tf's own on-the-fly tokenizer. `--systems=opennmt --tfnmt_model_dir=<an earlier tfnmt
run>` trains only the peer, sized by that run.

Prints one JSON line (per system, recipe and budget: step, minutes, BLEU, chrF, signatures) and
writes --plot (PNG: test BLEU against training minutes). Budgets can be run one command at a
time and their JSON lines combined afterwards into one result and plot (same machine and
precision; bench/results/ keeps the lines behind bench/README.md's figures):

  python bench/quality.py --minutes=15 --work_dir=runs/quality-15 ... > runs/quality-15.json
  python bench/quality.py --combine=runs/quality-15.json,bench/results/quality-avx2-epyc-60.json \
      --plot=runs/quality/combined.png
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

from common import (MALLOC, PEER_LAUNCHER, ROOT, cpu_description, peer_environment,
                    peer_model_script)
from tfnmt import cpu_kernels, paths  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("peer_malloc", "system", ["system", "tcmalloc"], "C allocator of the "
                  "OpenNMT-tf processes: system (glibc, what its users get; default) or tcmalloc.")
flags.DEFINE_string("onmt_python", None, "Python of an environment with OpenNMT-tf 2.32 "
                    "(empty: tfnmt only).")
flags.DEFINE_list("minutes", ["15", "30", "60"], "Training budgets in wall-clock minutes.")
flags.DEFINE_integer("checkpoint_steps", 100, "Steps between the checkpoints both systems save.")
flags.DEFINE_float("checkpoint_minutes", 2.5, "Minutes between the checkpoints scored for the "
                   "plot (the last one saved before each multiple).")
flags.DEFINE_enum("mixed_precision", "none", ["none", "bf16"], "Training compute dtype of both.")
flags.DEFINE_string("work_dir", "runs/quality", "Where both systems train (emptied first).")
flags.DEFINE_list("peer_configs", ["budgeted", "noam4000"], "OpenNMT-tf recipes to run: "
                  "budgeted (tfnmt's warm-up, peak and label smoothing, cosine to zero at the "
                  "budget's last step), budgeted_smoothed (the same, label smoothing 0.1), "
                  "budgeted_dropout (the same, tfnmt's dropout from the first update), noam "
                  "(tfnmt's warm-up and scale on Noam's decay), noam4000 (the paper's).")
flags.DEFINE_float("calibration_minutes", 4.0, "Length of the run that measures a system's steps "
                   "per minute for its budgeted recipes.")
flags.DEFINE_float("budget_margin", 0.05, "The peer's budgeted runs plan this fraction fewer "
                   "steps than the calibration predicts (their final checkpoint).")
flags.DEFINE_float("tfnmt_margin", 0.02, "tfnmt's runs train for this fraction less than the "
                   "budget leaves after start-up (on top of the 2% its own plan keeps).")
flags.DEFINE_float("replan_unused", 0.1, "A budgeted run that ends with more than this fraction "
                   "of its budget unused is trained again, planned from its own pace.")
flags.DEFINE_list("tfnmt_flags", [], "Extra train.py flags of tfnmt's runs (its calibration "
                  "included), e.g. --tfnmt_flags=--subword_alpha=0.1; default none: the main job.")
flags.DEFINE_string("tfnmt_model_dir", None, "Without tfnmt in --systems: an earlier tfnmt "
                    "run's model_dir, whose settings and SentencePiece model size the peer.")
flags.DEFINE_list("systems", ["tfnmt", "opennmt"], "Which systems to train and score (the peer "
                  "needs tfnmt's run: its model size and SentencePiece model).")
flags.DEFINE_string("plot", "runs/quality/quality.png", "PNG plot of test BLEU against minutes.")
flags.DEFINE_integer("score_sentences", 0, "Score only the first N test sentences (0: all).")
flags.DEFINE_list("combine", [], "Train nothing: merge the JSON lines that earlier runs of this "
                  "script printed on one machine (files) into one result and plot.")

PEER_CONFIG = """model_dir: {work}/model
data:
  train_features_file: {data}/train{text}.de
  train_labels_file: {data}/train{text}.en
  source_vocabulary: {data}/vocab.txt
  target_vocabulary: {data}/vocab.txt
{tokenization}params:
  optimizer: Adam
  optimizer_params: {{beta_1: 0.9, beta_2: 0.98, epsilon: 1.0e-9}}
  learning_rate: {learning_rate}
  {schedule}
  label_smoothing: {label_smoothing}
  beam_width: 4
  length_penalty: 0.6
  num_hypotheses: 1
train:
  batch_size: {batch_tokens}
  batch_type: tokens
  effective_batch_size: null
  length_bucket_width: 1
  maximum_features_length: 256
  maximum_labels_length: 256
  sample_buffer_size: -1
  save_checkpoints_steps: {checkpoint_steps}
  keep_checkpoint_max: 10000
  max_step: {max_step}
  save_summary_steps: 100
infer:
  batch_size: 32
  batch_type: examples
  length_bucket_width: 5
"""

# OpenNMT-tf recipes: tfnmt's main-job warm-up, peak and label smoothing with a decay to zero at
# the budget's last step (OpenNMT-tf's CosineAnnealing); the same with the paper's label
# smoothing 0.1; the same on Noam's open-ended decay; and the paper-style Noam recipe OpenNMT-tf's
# own Transformer auto_config starts from (learning rate 2, 4,000 warm-up steps, smoothing 0.1).
# `budgeted_dropout` has tfnmt's dropout rate on from the first update: where tfnmt starts it
# late, the peer's nearest recipe for budgets long enough to reach that start.
# `budgeted_sampled` reads raw text and samples each read's segmentation with OpenNMT-tf's own
# tokenizer (pyonmttok: the same SentencePiece model, tfnmt's --subword_alpha/--subword_nbest,
# else 0.1 among the 64 best), as tfnmt's runs with --subword_alpha do.
PEER_RECIPES = {"budgeted": {"budgeted": True},
                "budgeted_sampled": {"budgeted": True, "sampled": True},
                "budgeted_smoothed": {"budgeted": True, "label_smoothing": 0.1},
                "budgeted_dropout": {"budgeted": True, "dropout_from_start": True}, "noam": {},
                "noam4000": {"lr_scale": 2.0, "warmup_steps": 4000, "label_smoothing": 0.1}}
NOAM = ("decay_type: NoamDecay\n  decay_params: {{model_dim: {d_model}, "
        "warmup_steps: {warmup_steps}}}")
COSINE = ("decay_type: CosineAnnealing\n  decay_params: {{warmup_steps: {warmup_steps}, "
          "max_step: {max_step}}}")
flags.register_validator("peer_configs", lambda names: set(names) <= set(PEER_RECIPES),
                         f"--peer_configs: names among {', '.join(PEER_RECIPES)}")


def train_until(command, budget_seconds, log_path, env):
    """Runs `command` until it exits or `budget_seconds` have passed since it started (then
    SIGTERM, then SIGKILL); returns its start time. (Not SIGINT: a shell starting this script
    in the background makes its children ignore SIGINT.)

    Raises:
      RuntimeError: the command failed before its budget (a full disk, say), naming its log.
    """
    start = time.time()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=env)
        try:
            process.wait(timeout=budget_seconds)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return start
    if process.returncode != 0:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            last = (log.read().strip().splitlines() or ["(empty log)"])[-1]
        raise RuntimeError(f"{command[1]} failed (exit {process.returncode}) after "
                           f"{(time.time() - start) / 60:.1f} of {budget_seconds / 60:g} "
                           f"minutes; {log_path} ends: {last}")
    return start


def checkpoint_times(directory, start, pattern):
    """[(step, minutes after start)] of the checkpoints in `directory` (by their index files'
    modification times), oldest first."""
    found = []
    for name in os.listdir(directory):
        match = re.fullmatch(pattern, name)
        if match:
            minutes = (os.path.getmtime(os.path.join(directory, name)) - start) / 60
            found.append((int(match.group(1)), minutes))
    return sorted(found)


def chosen(checkpoints, budgets, every):
    """The checkpoints to score: the last one before each budget, and the last one before each
    multiple of `every` minutes (for the plot)."""
    marks = sorted(set(budgets) | {every * k for k in range(1, int(max(budgets) / every) + 1)})
    picks = {}
    for mark in marks:
        before = [c for c in checkpoints if c[1] <= mark + 1e-9]
        if before:
            picks[before[-1][0]] = before[-1]
    return [picks[step] for step in sorted(picks)]


def score(hypotheses, references):
    from tfnmt.inference.sacrebleu_scores import corpus_scores

    scores = corpus_scores(hypotheses, references, signatures=True)
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in scores.items()}


def test_pairs():
    from tfnmt.data.corpus import read_corpus

    pairs = list(read_corpus("embedded", "test"))
    return pairs[:FLAGS.score_sentences] if FLAGS.score_sentences else pairs


def calibrate(checkpoints):
    """(step, minutes, steps per minute) from a run's [(step, minutes)] checkpoints: the pace
    of its later half, when start-up, tracing and cold caches are behind it."""
    if len(checkpoints) < 2:
        raise RuntimeError("the calibration run saved fewer than two checkpoints: raise "
                           "--calibration_minutes or lower --checkpoint_steps")
    last_step, last_minutes = checkpoints[-1]
    later = [c for c in checkpoints[:-1] if c[1] >= last_minutes / 2]
    first_step, first_minutes = later[0] if later else checkpoints[-2]
    if last_minutes <= first_minutes:  # saved in the same instant: from the first one
        first_step, first_minutes = checkpoints[0]
    rate = (last_step - first_step) / max(last_minutes - first_minutes, 1e-6)
    return {"step": last_step, "minutes": round(last_minutes, 2),
            "steps_per_minute": round(rate, 1)}


def steps_within(calibration, budget):
    """Steps a run of the calibrated system completes within `budget` minutes, less the margin."""
    rate = calibration["steps_per_minute"]
    steps = calibration["step"] + rate * (budget - calibration["minutes"])
    return max(int(steps * (1 - FLAGS.budget_margin)), FLAGS.checkpoint_steps)


def budget_result(checkpoints, steps, budget):
    """The checkpoint a budgeted run is scored by: its last step, or the last one saved within
    the budget if the run was stopped there."""
    within = [c for c in checkpoints if c[1] <= budget + 1e-9]
    if not within:
        raise RuntimeError(f"no checkpoint within {budget} minutes")
    return within[-1], within[-1][0] < steps


def budgeted_runs(train, calibration, budgets):
    """Trains a budgeted recipe once per budget (ascending), each planned from the longest run
    so far (first: `calibration`); a run that ends more than --replan_unused of its budget
    early is trained again, planned from its own pace.

    Args:
      train: (name, minutes, steps) -> (run handle, [(step, minutes)] checkpoints).
      calibration: `calibrate`'s result for the first budget.
      budgets: minutes, ascending.

    Returns:
      [(handle, (step, minutes), cut, plans)]: the scored checkpoint, whether the budget
      stopped the run, and the calibrations it was planned from.
    """
    runs = []
    for budget in budgets:
        plans = [calibration]
        steps = steps_within(calibration, budget)
        handle, checkpoints = train(f"{budget:g}min", budget, steps)
        (step, minutes), cut = budget_result(checkpoints, steps, budget)
        if not cut and minutes < budget * (1 - FLAGS.replan_unused):
            plans.append(calibrate(checkpoints))
            steps = steps_within(plans[-1], budget)
            handle, checkpoints = train(f"{budget:g}min-replanned", budget, steps)
            (step, minutes), cut = budget_result(checkpoints, steps, budget)
        calibration = calibrate(checkpoints)
        runs.append((handle, (step, minutes), cut, plans))
    return runs


def load_scorer(model_dir):
    """translate(step) -> test hypotheses of a tfnmt checkpoint (beam 4, alpha 0.6)."""
    # Imported only now: TensorFlow's thread pools must not compete with the training process.
    from tfnmt.checkpoints import load_model
    from tfnmt.inference.batching import translate_lines
    from tfnmt.inference.serving import TranslationModule

    def hypotheses(step):
        path = os.path.join(model_dir, "checkpoints", f"ckpt-{step}")
        model, proto, _ = load_model(model_dir, path)
        module = TranslationModule(model, proto, beam_size=4, alpha=0.6, n_best=1)

        def translate(sentences):
            out = module.serve(sentences)
            return out["translations"], out["scores"]

        return translate_lines(translate, [s for s, _ in test_pairs()], 64)
    return hypotheses


def start_up_minutes(calibration):
    """Minutes from a run's start to where its steady pace would have had it at step 0: data
    preparation, model building and tracing."""
    return max(calibration["minutes"] - calibration["step"] / calibration["steps_per_minute"],
               0.0)


def run_tfnmt(work, budgets):
    """Trains the main job's recipe per budget (or once, for an open-ended schedule) and scores
    it; -> ({"calibration", "checkpoints"}, settings, SentencePiece model path)."""
    from tfnmt.model.presets import get_training

    def train(name, minutes, steps=None, train_minutes=None):
        model_dir = os.path.join(work, name)
        length = (f"--train_minutes={train_minutes:.3f}" if train_minutes
                  else f"--train_steps={steps or 100000000}")
        # A run planned for a time is scored at its end (or its last checkpoint within the
        # budget): the newest few checkpoints do (each of the cpu preset's is ~70 MB).
        keep = 20 if train_minutes else 10000
        command = [sys.executable, os.path.join(ROOT, "train.py"), f"--model_dir={model_dir}",
                   length, "--eval_every=0",
                   f"--checkpoint_every={FLAGS.checkpoint_steps}", f"--keep_checkpoints={keep}",
                   f"--mixed_precision={FLAGS.mixed_precision}", "--test_report=false",
                   "--alpha=0.6"] + FLAGS.tfnmt_flags  # both are scored with alpha 0.6
        start = train_until(command, minutes * 60, os.path.join(work, f"{name}.log"), os.environ)
        return model_dir, checkpoint_times(os.path.join(model_dir, "checkpoints"), start,
                                           r"ckpt-(\d+)\.index")

    references = [t for _, t in test_pairs()]
    result = {"checkpoints": []}
    if get_training("cpu")["lr_decay"] == "linear":
        # The main job's way: a time budget, its updates planned from its own pace.
        model_dir, checkpoints = train("tfnmt-calibration", FLAGS.calibration_minutes)
        result["calibration"] = calibrate(checkpoints)
        start_up = result["calibration"]["start_up_minutes"] = round(
            start_up_minutes(result["calibration"]), 2)
        for budget in budgets:
            train_minutes = (budget - start_up) * (1 - FLAGS.tfnmt_margin)
            if train_minutes <= 0:
                raise app.UsageError(f"a {budget:g}-minute budget leaves no training time after "
                                     f"tfnmt's {start_up:g} minutes of start-up")
            model_dir, checkpoints = train(f"tfnmt-{budget:g}min", budget,
                                           train_minutes=train_minutes)
            with open(os.path.join(model_dir, paths.SETTINGS)) as f:
                planned = json.load(f)["train"]["train_steps"]
            (step, minutes), cut = budget_result(checkpoints, planned, budget)
            result["checkpoints"].append({"step": step, "minutes": round(minutes, 2),
                                          "cut": cut, "planned_steps": planned,
                                          "train_minutes": round(train_minutes, 2),
                                          **score(load_scorer(model_dir)(step), references)})
    else:
        model_dir, checkpoints = train("tfnmt", max(budgets))
        scorer = load_scorer(model_dir)
        for step, minutes in chosen(checkpoints, budgets, FLAGS.checkpoint_minutes):
            result["checkpoints"].append({"step": step, "minutes": round(minutes, 2),
                                          **score(scorer(step), references)})
    with open(os.path.join(model_dir, paths.SETTINGS)) as f:
        settings = json.load(f)
    return result, settings, os.path.join(model_dir, paths.VOCAB)


def write_peer_data(work, spm_path):
    """The train and test splits as space-separated pieces of tfnmt's SentencePiece model (and
    as raw text, `<split>.raw.<language>`, for the recipes that tokenize on the fly), the pieces
    as OpenNMT-tf's vocabulary, and the SentencePiece model (spm.model)."""
    import sentencepiece

    from tfnmt.data.corpus import read_corpus

    shutil.copyfile(spm_path, os.path.join(work, "spm.model"))
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    for split in ("train", "test"):
        pairs = list(read_corpus("embedded", split))
        if split == "test":
            pairs = test_pairs()
        for side, language in ((0, "de"), (1, "en")):
            with open(os.path.join(work, f"{split}.{language}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(processor.encode(pair[side], out_type=str)) + "\n"
                             for pair in pairs)
            with open(os.path.join(work, f"{split}.raw.{language}"), "w",
                      encoding="utf-8") as f:
                f.writelines(" ".join(pair[side].split()) + "\n" for pair in pairs)
    with open(os.path.join(work, "vocab.txt"), "w", encoding="utf-8") as f:
        # OpenNMT-tf adds its own <blank>, <s>, </s> in front; the pieces follow.
        f.writelines(processor.id_to_piece(i) + "\n" for i in range(4, processor.get_piece_size()))


def peer_dropout(settings, from_start=False):
    """The peer's residual dropout: tfnmt's where it is on from the start, or where the recipe
    asks for it from the start (`from_start`); else 0 where tfnmt starts it after some epochs
    (`--dropout_from_epoch`), which OpenNMT-tf cannot (tfnmt's runs up to that epoch train
    without it)."""
    late = settings["train"].get("dropout_from_epoch", 0.0)
    return 0.0 if late and not from_start else settings["model"]["dropout"]


def peer_recipe(settings, recipe_name):
    """The peer's settings for a recipe of PEER_RECIPES, from tfnmt's run's settings."""
    training = settings["train"]
    recipe = {"lr_scale": training["lr_scale"], "warmup_steps": training["warmup_steps"],
              "label_smoothing": training["label_smoothing"], **PEER_RECIPES[recipe_name]}
    recipe["dropout"] = peer_dropout(settings, recipe.pop("dropout_from_start", False))
    if recipe.pop("sampled", False):
        recipe["subword_alpha"] = training.get("subword_alpha") or 0.1
        recipe["subword_nbest"] = training.get("subword_nbest", 64) \
            if training.get("subword_alpha") else 64
    return recipe


def peer_tokenization(data_work, recipe):
    """The data section's on-the-fly tokenization of a sampled recipe ("" for the others, which
    read pieces)."""
    if "subword_alpha" not in recipe:
        return ""
    params = (f"{{type: OpenNMTTokenizer, params: {{mode: none, sp_model_path: "
              f"{data_work}/spm.model, sp_nbest_size: {recipe['subword_nbest']}, "
              f"sp_alpha: {recipe['subword_alpha']}}}}}")
    return f"  source_tokenization: {params}\n  target_tokenization: {params}\n"


def run_peer(work, data_work, settings, recipe_name, budgets, calibration=None):
    """Trains OpenNMT-tf with one recipe and scores it: per budget for the budgeted recipe
    (calibrated on `calibration`, a run at the same dropout, else on a calibration run of its
    own), else once for the largest budget. -> {"recipe", "checkpoints", "calibration"}."""
    model, training = settings["model"], settings["train"]
    recipe = peer_recipe(settings, recipe_name)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "model.py"), "w") as f:
        f.write(peer_model_script(model, recipe["dropout"]))
    with open(os.path.join(work, "launcher.py"), "w") as f:
        f.write(PEER_LAUNCHER)
    policy = {"bf16": "mixed_bfloat16", "none": ""}[FLAGS.mixed_precision]
    references = [t for _, t in test_pairs()]
    # Raw text where OpenNMT-tf tokenizes (and detokenizes its translations) itself.
    text = ".raw" if "subword_alpha" in recipe else ""

    def train(name, minutes, max_step=None):
        run_dir = os.path.join(work, name)
        os.makedirs(run_dir, exist_ok=True)
        if max_step is None:  # open-ended: Noam's decay
            learning_rate = recipe["lr_scale"]
            schedule = NOAM.format(d_model=model["d_model"], warmup_steps=recipe["warmup_steps"])
        else:  # tfnmt's peak, then cosine to zero at max_step
            learning_rate = (recipe["lr_scale"] * model["d_model"] ** -0.5
                             * recipe["warmup_steps"] ** -0.5)
            schedule = COSINE.format(warmup_steps=recipe["warmup_steps"], max_step=max_step)
        config = os.path.join(run_dir, "config.yml")
        with open(config, "w") as f:
            f.write(PEER_CONFIG.format(work=run_dir, data=data_work, text=text,
                                       tokenization=peer_tokenization(data_work, recipe),
                                       learning_rate=learning_rate,
                                       schedule=schedule, batch_tokens=training["batch_tokens"],
                                       label_smoothing=recipe["label_smoothing"],
                                       checkpoint_steps=FLAGS.checkpoint_steps,
                                       max_step=max_step or 100000000))
        launcher = [FLAGS.onmt_python, os.path.join(work, "launcher.py"), "--model",
                    os.path.join(work, "model.py"), "--config", config]
        start = train_until([*launcher, "train"], minutes * 60,
                            os.path.join(run_dir, "train.log"),
                            peer_environment(FLAGS.peer_malloc, PEER_POLICY=policy))
        return launcher, run_dir, checkpoint_times(os.path.join(run_dir, "model"), start,
                                                   r"ckpt-(\d+)\.index")

    def bleu(launcher, run_dir, step):
        predictions = os.path.join(run_dir, f"test.{step}.en")
        with open(os.path.join(run_dir, f"infer.{step}.log"), "w") as log:
            # --checkpoint_path is an option of onmt-main itself, before the command.
            subprocess.run([*launcher, "--checkpoint_path",
                            os.path.join(run_dir, "model", f"ckpt-{step}"), "infer",
                            "--features_file", os.path.join(data_work, f"test{text}.de"),
                            "--predictions_file", predictions],
                           check=True, stdout=log, stderr=subprocess.STDOUT,
                           env=peer_environment(FLAGS.peer_malloc))
        with open(predictions, encoding="utf-8") as f:
            hypotheses = [line.strip() if text else
                          "".join(line.split()).replace("\u2581", " ").strip() for line in f]
        return score(hypotheses, references)

    results = []
    budgeted = recipe.pop("budgeted", False)
    recipe["decay"] = "cosine to zero at the budget's last step" if budgeted else "noam"
    if budgeted:
        if calibration is None:
            calibration = calibrate(train("calibration", FLAGS.calibration_minutes)[2])
        def train_budgeted(name, minutes, steps):
            launcher, run_dir, checkpoints = train(name, minutes, steps)
            return (launcher, run_dir), checkpoints

        for (launcher, run_dir), (step, minutes), cut, plans in budgeted_runs(
                train_budgeted, calibration, budgets):
            results.append({"step": step, "minutes": round(minutes, 2), "cut": cut,
                            "planned_from": plans, **bleu(launcher, run_dir, step)})
    else:
        launcher, run_dir, checkpoints = train("run", max(budgets))
        calibration = calibrate(checkpoints)
        for step, minutes in chosen(checkpoints, budgets, FLAGS.checkpoint_minutes):
            results.append({"step": step, "minutes": round(minutes, 2),
                            **bleu(launcher, run_dir, step)})
    return {"recipe": recipe, "checkpoints": results, "calibration": calibration}


def at_budget(checkpoints, budget):
    before = [c for c in checkpoints if c["minutes"] <= budget + 1e-9]
    return before[-1] if before else None


def summarise(result):
    """Adds each system's checkpoint at each budget (the last scored within it) and the best
    peer recipe there to `result`; -> the curves to plot ({label: checkpoints})."""
    budgets = result["budgets_minutes"]
    curves = {}
    if "tfnmt" in result:
        checkpoints = result["tfnmt"]["checkpoints"]
        result["tfnmt"]["at"] = {str(b): at_budget(checkpoints, b) for b in budgets}
        curves["tfnmt"] = checkpoints
    peers = result.get("opennmt", {})
    for name, peer in peers.items():
        curves[f"OpenNMT-tf ({name})"] = peer["checkpoints"]
    if peers:
        result["opennmt_best_at"] = {}
        for budget in budgets:
            scored = [(at_budget(p["checkpoints"], budget), name) for name, p in peers.items()]
            scored = [(c, name) for c, name in scored if c]
            if scored:
                best, name = max(scored, key=lambda pair: pair[0]["bleu"])
                result["opennmt_best_at"][str(budget)] = dict(best, recipe=name)
    return curves


def combine(paths):
    """One result from the JSON lines of earlier runs of this script on one machine (a budget
    per run, say): their budgets and every system's scored checkpoints, by minutes."""
    runs = []
    for path in paths:
        with open(path) as f:
            lines = [line for line in f if line.lstrip().startswith("{")]
        if not lines:
            raise app.UsageError(f"--combine: {path} holds no JSON line of bench/quality.py")
        runs.append(json.loads(lines[-1]))
    for key in ("machine", "mixed_precision", "tfnmt_kernels", "tfnmt_flags"):
        values = {str(run.get(key)) for run in runs}
        if key == "machine" and not all("(" in value for value in values):
            # Older runs named the CPU without its family and ISA ("AMD EPYC, 2 cores").
            values = {value.split(" (")[0].split(",")[0] for value in values}
        if len(values) > 1:
            raise app.UsageError(f"--combine: the runs differ in {key}: {sorted(values)}")

    def by_minutes(checkpoints):
        return sorted(checkpoints, key=lambda c: c["minutes"])

    result = {key: runs[0][key] for key in ("machine", "mixed_precision", "tfnmt_malloc",
                                            "tfnmt_kernels", "peer_malloc", "tfnmt_flags")
              if key in runs[0]}
    result["machine"] = max((run["machine"] for run in runs), key=lambda m: "(" in m)
    result["budgets_minutes"] = sorted({float(b) for run in runs
                                        for b in run["budgets_minutes"]})
    result["combined"] = list(paths)
    tfnmt = [c for run in runs for c in run.get("tfnmt", {}).get("checkpoints", [])]
    if tfnmt:
        result["tfnmt"] = {"checkpoints": by_minutes(tfnmt)}
    peers = {}
    for run in runs:
        for name, peer in run.get("opennmt", {}).items():
            peers.setdefault(name, {"recipe": peer.get("recipe", name), "checkpoints": []})
            peers[name]["checkpoints"] = by_minutes(peers[name]["checkpoints"]
                                                    + peer["checkpoints"])
    if peers:
        result["opennmt"] = peers
    return result


def plot(path, curves, result):
    """Writes the PNG of test BLEU against minutes to `path`; False (with a message) when
    matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("no plot: pip install -r bench/requirements.txt (matplotlib)", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, checkpoints in curves.items():
        axes.plot([c["minutes"] for c in checkpoints], [c["bleu"] for c in checkpoints],
                  marker="o", label=label)
    # From zero on both axes: a single budget's points are not stretched over the plot.
    axes.set_xlim(0, max(result["budgets_minutes"]) * 1.05)
    top = max((c["bleu"] for checkpoints in curves.values() for c in checkpoints), default=1)
    axes.set_ylim(0, top * 1.15)  # headroom: the legend sits above the points
    axes.set_xlabel("training wall-clock minutes")
    axes.set_ylabel("test sacreBLEU (beam 4)")
    precision = {"none": "float32", "bf16": "bfloat16"}[result["mixed_precision"]]
    axes.set_title(f"{result['machine']}, {precision}", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=120)
    return True


def train_and_score(budgets):
    """Trains and scores the systems of --systems for each budget; -> the result."""
    work = os.path.abspath(FLAGS.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    result = {"machine": cpu_description(), "mixed_precision": FLAGS.mixed_precision,
              "tfnmt_malloc": MALLOC,
              # what train.py sets for itself (on a copy: this process keeps its own)
              "tfnmt_kernels": cpu_kernels.use_onednn(dict(os.environ)),
              "peer_malloc": FLAGS.peer_malloc,
              "budgets_minutes": budgets}
    if FLAGS.tfnmt_flags:
        result["tfnmt_flags"] = FLAGS.tfnmt_flags
    settings = None
    if "tfnmt" in FLAGS.systems:
        result["tfnmt"], settings, spm_path = run_tfnmt(work, budgets)
    elif FLAGS.tfnmt_model_dir:
        with open(os.path.join(FLAGS.tfnmt_model_dir, paths.SETTINGS)) as f:
            settings = json.load(f)
        spm_path = os.path.join(FLAGS.tfnmt_model_dir, paths.VOCAB)
        result["peer_sized_from"] = os.path.abspath(FLAGS.tfnmt_model_dir)
    if "opennmt" in FLAGS.systems and FLAGS.onmt_python:
        if settings is None:
            raise app.UsageError("the peer is sized from tfnmt's run: include tfnmt in "
                                 "--systems or give --tfnmt_model_dir")
        data_work = os.path.join(work, "opennmt-data")
        os.makedirs(data_work)
        write_peer_data(data_work, spm_path)
        peers, calibrations = {}, {}  # (dropout, sampled) -> the pace of a run with them
        # Open-ended recipes first: their runs calibrate the budgeted ones of their dropout and
        # tokenization (dropout and sampled segmentations slow a step).
        for name in sorted(FLAGS.peer_configs, key=lambda n: PEER_RECIPES[n].get("budgeted", 0)):
            recipe = peer_recipe(settings, name)
            pace = (recipe["dropout"], "subword_alpha" in recipe)
            peers[name] = run_peer(os.path.join(work, f"opennmt-{name}"), data_work, settings,
                                   name, budgets, calibrations.get(pace))
            calibrations[pace] = peers[name]["calibration"]
        result["opennmt"] = peers
    return result


def main(argv):
    del argv
    if FLAGS.combine:
        result = combine(FLAGS.combine)
    else:
        result = train_and_score(sorted(float(m) for m in FLAGS.minutes))
    curves = summarise(result)
    if FLAGS.plot and curves and plot(FLAGS.plot, curves, result):
        result["plot"] = FLAGS.plot  # only a plot that was written
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
