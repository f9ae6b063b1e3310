"""The best checkpoint by a dev metric and early stopping: the tracker, and train.py with it."""
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import python, train_flags
from tfnmt.checkpoints import candidate_checkpoints, checkpoint_prefixes, load_model
from tfnmt.training.best import BestCheckpoint


def small_model():
    model = keras.Sequential([keras.layers.Dense(3)])
    model.build((None, 2))
    return model


def saved_kernel(prefix, model):
    clone = small_model()
    tf.train.Checkpoint(model=clone).read(prefix).expect_partial()
    return clone.layers[0].kernel.numpy()


@pytest.mark.parametrize("metric, values, best_step", [
    ("bleu", [1.0, 3.0, 2.0, 3.0, float("nan")], 2),   # higher is better; a tie is no gain
    ("loss", [5.0, 4.0, 4.5, 4.0, float("nan")], 2),   # lower is better
])
def test_keeps_the_best_weights_and_counts_evaluations_without_gain(tmp_path, metric, values,
                                                                    best_step):
    model = small_model()
    directory = str(tmp_path / "best")
    best = BestCheckpoint(directory, model, metric, patience=3)
    kernels = {}
    for step, value in enumerate(values, start=1):
        model.layers[0].kernel.assign(np.full((2, 3), float(step), np.float32))
        kernels[step] = model.layers[0].kernel.numpy()
        assert best.update(step, {metric: value}) == (step <= best_step)
        assert best.should_stop == (step - best_step >= 3)
    # Only the best evaluation's weights are on disk, and the state names them.
    assert [os.path.basename(p) for p in checkpoint_prefixes(directory)] == [f"ckpt-{best_step}"]
    np.testing.assert_array_equal(saved_kernel(os.path.join(directory, f"ckpt-{best_step}"),
                                               model), kernels[best_step])
    state = json.load(open(os.path.join(directory, "best.json")))
    assert state == {"metric": metric, "value": values[best_step - 1], "step": best_step,
                     "checkpoint": f"ckpt-{best_step}", "evaluations_without_improvement": 3,
                     "evaluated_step": len(values),
                     **({"bleu_tokenize": "13a"} if metric == "bleu" else {})}
    # A resumed run goes on counting from the saved state.
    resumed = BestCheckpoint(directory, small_model(), metric, patience=4)
    assert not resumed.should_stop
    resumed.update(len(values) + 1, {metric: values[0]})
    assert resumed.should_stop
    assert not BestCheckpoint(directory, small_model(), metric, patience=0).should_stop  # never


def test_the_weights_evaluated_last_evaluated_again_change_nothing(tmp_path):
    # The end of a finished run run again (here under a search rule that scores the final
    # weights higher than their first evaluation did) neither makes them the best nor counts
    # as an evaluation without gain; the next step's evaluation counts.
    model = small_model()
    directory = str(tmp_path / "best")
    best = BestCheckpoint(directory, model, "bleu", patience=3)
    assert best.update(4, {"bleu": 5.0}) and not best.update(8, {"bleu": 3.0})
    recorded = open(os.path.join(directory, "best.json")).read()
    again = BestCheckpoint(directory, small_model(), "bleu", patience=3)
    assert not again.update(8, {"bleu": 9.0})
    assert open(os.path.join(directory, "best.json")).read() == recorded
    assert again.state["checkpoint"] == "ckpt-4" and \
        again.state["evaluations_without_improvement"] == 1
    assert [os.path.basename(p) for p in checkpoint_prefixes(directory)] == ["ckpt-4"]
    assert again.update(12, {"bleu": 9.0}) and again.state["checkpoint"] == "ckpt-12"
    # A state written before the step evaluated last was kept: only its best step is known.
    state = json.load(open(os.path.join(directory, "best.json")))
    del state["evaluated_step"]
    with open(os.path.join(directory, "best.json"), "w") as f:
        json.dump(state, f)
    older = BestCheckpoint(directory, small_model(), "bleu")
    assert not older.update(12, {"bleu": 20.0}) and older.update(13, {"bleu": 1.0}) is False
    assert older.state["evaluations_without_improvement"] == 1


@pytest.mark.parametrize("unmeasured", [None, float("nan")])
def test_an_unmeasured_first_evaluation_counts_without_gain(tmp_path, unmeasured):
    # None: no dev pair within max_length; NaN: a diverged model. Neither is the best, not even
    # as the first evaluation, and the state is written although no checkpoint is yet.
    directory = tmp_path / "best"
    best = BestCheckpoint(str(directory), small_model(), "loss", patience=2)
    assert not best.update(1, {"loss": unmeasured})
    assert checkpoint_prefixes(str(directory)) == []
    assert json.load(open(directory / "best.json"))["evaluations_without_improvement"] == 1
    assert best.update(2, {"loss": 3.0}) and not best.should_stop
    assert json.load(open(directory / "best.json"))["checkpoint"] == "ckpt-2"


def test_interrupted_and_changed_metric_states(tmp_path, caplog):
    model = small_model()
    directory = str(tmp_path / "best")
    best = BestCheckpoint(directory, model, "bleu")
    best.update(1, {"bleu": 1.0})
    # A run killed after writing a new best but before recording it leaves a stray checkpoint:
    # the next run removes it and keeps the recorded one.
    tf.train.Checkpoint(model=model).write(os.path.join(directory, "ckpt-7"))
    BestCheckpoint(directory, model, "bleu")
    assert [os.path.basename(p) for p in checkpoint_prefixes(directory)] == ["ckpt-1"]
    # The same evaluation again (the final one, at the step last evaluated) is no new evidence.
    assert not best.update(1, {"bleu": 0.0}) and best.state["evaluations_without_improvement"] == 0
    # Choosing by another metric starts over, and keeps the old checkpoint until replaced.
    by_loss = BestCheckpoint(directory, model, "loss")
    assert "chosen by bleu (tokenization 13a); now choosing by loss" in caplog.text
    assert candidate_checkpoints(str(tmp_path), "best") == [os.path.join(directory, "ckpt-1")]
    assert by_loss.update(2, {"loss": 9.0})
    assert [os.path.basename(p) for p in checkpoint_prefixes(directory)] == ["ckpt-2"]
    with pytest.raises(ValueError, match="unknown metric"):
        BestCheckpoint(directory, model, "rouge")


def test_a_best_bleu_of_another_tokenization_is_not_compared(tmp_path, caplog):
    # BLEU of Chinese tokenized as words (13a) is near 0, as characters (zh) tens of points:
    # a best 13a value recorded by an older run (no tokenization in its state) does not
    # decide whether a zh value improves, and its checkpoint stays until one replaces it.
    model = small_model()
    directory = str(tmp_path / "best")
    older = BestCheckpoint(directory, model, "bleu")
    assert older.update(1, {"bleu": 0.4})
    state_path = os.path.join(directory, "best.json")
    state = json.load(open(state_path))
    del state["bleu_tokenize"]
    json.dump(state, open(state_path, "w"))
    assert BestCheckpoint(directory, model, "bleu", bleu_tokenize="13a").state["value"] == 0.4
    by_characters = BestCheckpoint(directory, model, "bleu", patience=1, bleu_tokenize="zh")
    assert "chosen by bleu (tokenization 13a); now choosing by bleu (tokenization zh)" \
        in caplog.text
    assert by_characters.state["value"] is None
    assert candidate_checkpoints(str(tmp_path), "best") == [os.path.join(directory, "ckpt-1")]
    assert by_characters.update(2, {"bleu": 0.3}) and not by_characters.update(3, {"bleu": 0.2})
    assert by_characters.should_stop
    assert json.load(open(state_path))["bleu_tokenize"] == "zh"
    assert [os.path.basename(p) for p in checkpoint_prefixes(directory)] == ["ckpt-2"]


def test_train_py_stops_early_and_exports_the_best(small_corpus, train_data, tmp_path):
    # With a learning rate of ~1e-33 the weights do not move in float32, so every evaluation
    # scores exactly what the first did: the first is the best, and with --early_stopping=2
    # training stops at the third (step 6 of 40), whatever the kernels compute.
    model_dir = str(tmp_path / "run")
    flags = train_flags(small_corpus, train_data, model_dir, train_steps=40, eval_every=2,
                        checkpoint_every=4, average_last=0, lr_scale=1e-30, early_stopping=2,
                        best_metric="loss")
    result = python(*flags)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped early at step 6: dev loss did not improve for 2 evaluations" in result.stdout
    assert "step      8/40" not in result.stdout
    assert tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")).endswith("ckpt-6")
    state = json.load(open(os.path.join(model_dir, "best", "best.json")))
    assert state["step"] == 2 and state["evaluations_without_improvement"] == 2
    # export.py --checkpoint=best and the default ("auto": no averaged checkpoint) load it.
    for which in ("best", "auto"):
        _, _, path = load_model(model_dir, which)
        assert path == os.path.join(model_dir, "best", "ckpt-2")
    # The same command again trains no further; without early stopping it trains on.
    again = python(*flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped early before: dev loss did not improve for 2" in again.stdout
    assert "/40 | loss" not in again.stdout
    on = python(*flags, "--early_stopping=0", "--train_steps=8", "--eval_every=100")
    assert on.returncode == 0, on.stderr[-3000:]
    assert "step      8/8 | loss" in on.stdout


def test_a_dev_split_longer_than_max_length_has_no_dev_loss_to_choose_by(small_corpus,
                                                                         tmp_path):
    # Every dev pair has 25 words or more a side, so max_length=20 (subwords) leaves out all of
    # them, but not every training pair. Choosing the best checkpoint by the dev loss is refused
    # before the run starts (no settings.json: the model_dir takes other flags); by BLEU the run
    # trains, translates the dev sources (cut to the model's length) and reports no dev loss.
    with open(small_corpus["dev"], encoding="utf-8") as f:
        long_pairs = [line for line in f
                      if all(len(side.split()) >= 25 for side in line.split("\t")[:2])]
    assert len(long_pairs) >= 20
    dev = tmp_path / "long_dev.tsv"
    dev.write_text("".join(long_pairs), encoding="utf-8")
    model_dir = tmp_path / "run"
    flags = train_flags(small_corpus, None, str(model_dir), dev_files=str(dev), max_length=20,
                        train_steps=4, eval_every=2, checkpoint_every=2, average_last=0,
                        bleu_sentences=4, test_report="false")
    refused = python(*flags, "--best_metric=loss", timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"train.py: --best_metric=loss: max_length=20 leaves out all {len(long_pairs)} dev pairs "
        "(more than 20 subwords on a side, EOS or BOS included), so no evaluation measures it: "
        "raise --max_length to keep them, or choose --best_metric=bleu")
    assert not (model_dir / "settings.json").exists()
    result = python(*flags, "--best_metric=bleu")
    assert result.returncode == 0, result.stderr[-3000:]
    evaluations = [line for line in result.stdout.splitlines() if line.startswith("eval step")]
    assert len(evaluations) == 2 and all(
        "dev loss n/a (no dev pair within max_length) | sacreBLEU " in line
        for line in evaluations), result.stdout
    report = json.load(open(model_dir / "report.json"))
    assert [report["dev_greedy"][k] for k in ("loss", "perplexity", "accuracy")] == [None] * 3
    # The best checkpoint is still chosen, by BLEU: an evaluation of the highest (logged) score.
    scores = [float(line.split("sacreBLEU ")[1].split()[0]) for line in evaluations]
    state = json.load(open(model_dir / "best" / "best.json"))
    assert state["metric"] == "bleu" and round(state["value"], 2) == max(scores)
    assert scores[state["step"] // 2 - 1] == max(scores)
