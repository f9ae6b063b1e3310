"""The training loop: distribution, accumulation, checkpoints, averaging, train.py itself."""
import collections
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import sacrebleu
import sentencepiece
import tensorflow as tf

from helpers import (ROOT, imported_modules, python, started,
                     teacher_forced_log_prob, train_flags)
from tfnmt import cpu_kernels, fast_ops
from tfnmt.checkpoints import ModelDirError, checkpoint_prefixes
from tfnmt.data import records, side_order
from tfnmt.inference import length_penalty
from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer
from tfnmt.training import cluster_sync
from tfnmt.training.distribute import PreReducedAdam
from tfnmt.training.schedule import paper_adam
from tfnmt.training.trainer import CheckpointKeeper, Trainer, average_checkpoints

TINY = get_preset("tiny", dropout=0.0)


def test_mirrored_two_devices_equal_one_device():
    # Two replicas, without and with XLA (`--jit_compile`, which compiles only each replica's
    # forward and backward passes: the all-reduce and the mirrored update run outside XLA).
    result = python("tests/distributed_check.py")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout.strip().splitlines()[-1])
    single = runs["single"]
    for mirrored in (runs["mirrored"], runs["mirrored_xla"]):
        assert (single["replicas"], mirrored["replicas"]) == (1, 2)
        for key in ("loss", "target_tokens", "grad_norm", "padding_fraction"):
            assert mirrored["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5)
        # PreReducedAdam overrides Keras's private `_all_reduce_sum_gradients` (keras is
        # pinned in requirements.txt): if Keras reduced again, the moments on 2 replicas would
        # be 2x and 4x.
        single_moments = np.array(single["moments"])
        mirrored_moments = np.array(mirrored["moments"])
        assert len(single_moments) == 2 * len(single["grads"])
        clear = np.abs(single_moments) > 1e-6  # above the summation-order noise of tiny values
        assert clear.sum() > 1000
        np.testing.assert_allclose(mirrored_moments[clear], single_moments[clear], rtol=1e-2,
                                   err_msg="Keras reduced the gradients again: see PreReducedAdam")
        # The gradient each update was given (from Adam's first moment).
        np.testing.assert_allclose(mirrored["grads"], single["grads"], atol=1e-6)
        # The update: every replica's copy of every weight changed alike, and as on one
        # device. Adam's first step moves a weight by about lr * sign(gradient), so only
        # weights whose gradient is clearly non-zero are compared.
        assert mirrored["replica_spread"] == 0.0
        moved = np.abs(single["grads"]) > 1e-4
        assert moved.sum() > 1000
        np.testing.assert_allclose(np.array(mirrored["weights"])[moved],
                                   np.array(single["weights"])[moved], atol=1e-6)
        # The check at the end of a run finds what the copies above show (none apart, before
        # and after), and one element of one replica's copy one ulp off, in a weight or an
        # Adam moment: the run stops in one line naming that copy.
        assert mirrored["differences"] == [None, None]
        assert mirrored["perturbed"][0].endswith("encoder_0/self_attention/key_kernel") and \
            "momentum" in mirrored["perturbed"][1]
        assert mirrored["errors"] == [
            f"after step 1 the replicas' copies of {path} differ (replica 1's is not replica "
            "0's): the checkpoints hold replica 0's; start the run again to resume every "
            "replica from them" for path in mirrored["perturbed"]]
    assert single["differences"] == [None]


def test_adam_update_equals_float64_adam_on_the_schedule():
    # PreReducedAdam's fused kernel (and Keras' stock update, with the fast ops off) against
    # Adam written out in float64: m, v, bias correction, epsilon outside the square root, on
    # the paper's schedule, for gradients from 1e-6 to 1 over six steps.
    rng = np.random.default_rng(0)
    start = rng.normal(size=(7, 5))
    grads = [rng.normal(size=(7, 5)) * 10.0 ** rng.uniform(-6, 0, size=(7, 5)) for _ in range(6)]
    for plain in (False, True):
        with fast_ops.plain_ops(plain):
            weight = tf.Variable(start.astype("float32"))
            optimizer = paper_adam(64, 3, 1.0, PreReducedAdam)
            step = tf.function(lambda g: optimizer.apply_gradients([(g, weight)]))
            rates = []
            for g in grads:
                rates.append(float(optimizer.learning_rate))  # the rate of the coming update
                step(tf.constant(g, tf.float32))
            ops = {op.type for op in step.get_concrete_function(
                tf.TensorSpec([7, 5], tf.float32)).graph.get_operations()}
        assert ("ResourceApplyAdam" in ops) == (not plain)
        w, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
        for t, (g, lr) in enumerate(zip(grads, rates), start=1):
            m = 0.9 * m + 0.1 * g
            v = 0.98 * v + 0.02 * g * g
            w -= lr * np.sqrt(1 - 0.98 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-9)
        assert np.abs(w - start).max() > max(rates)  # the weights moved by several steps
        np.testing.assert_allclose(weight.numpy(), w, rtol=1e-5, atol=1e-6)


def test_gradients_equal_plain_autodiff_under_every_model_flag_and_strategy():
    # Post-/pre-norm x sinusoidal/learned positions x shared/separate embeddings, each on 2
    # replicas (2 logical CPUs) with 2 micro-batches, and the one with every flag on also on
    # 1 device and with 1 micro-batch: the loop's gradients (custom GEMM, LayerNorm and loss
    # gradients, accumulation, all-reduce) against autodiff of the per-token mean loss
    # written out in plain ops.
    result = python("tests/distributed_check.py", "matrix", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(runs["matrix"]) == 8
    for run in runs["matrix"]:
        assert run["largest_gradient"] > 1e-3, run
        assert max(run["errors"].values()) < 2e-5, run
    assert sum(len(run["errors"]) for run in runs["matrix"]) == 8 + 3
    # Two replicas, the same batch, dropout 0.3: different masks, so different losses.
    first, second = runs["dropout_replica_losses"]
    assert first != second and abs(first - second) > 1e-3 * abs(first)


def test_learned_positions_get_one_adam_step_of_their_summed_gradient():
    # The encoder and decoder gather rows of one position table, so its gradient arrives as
    # slices with repeated rows. Adam's first step moves each weight by lr * g / (|g| + eps)
    # of its summed gradient g: about lr wherever g is clearly non-zero. (Squaring each slice
    # before summing, as Adam does on raw slices, moves rows with several slices less.)
    batch = {"source": np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32"),
             "target_in": np.array([[2, 5, 6, 7], [2, 8, 9, 0]], "int32"),
             "target_out": np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32")}
    keras.utils.set_random_seed(0)
    model = Transformer(vocab_size=30, **dict(TINY, position="learned", max_length=8))
    model.build()
    optimizer = paper_adam(64, 10, 1.0, PreReducedAdam)
    optimizer.build(model.trainable_variables)
    strategy = tf.distribute.get_strategy()
    trainer = Trainer(model, optimizer, strategy, 0.1)
    table = model.positions.position_embeddings
    before, lr = table.numpy(), float(optimizer.learning_rate)  # the first update's rate
    _, _, _, grads = strategy.run(trainer.replica_gradients, args=([batch],))
    gradient = grads[[v.path for v in model.trainable_variables].index(table.path)].numpy()
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    metrics = trainer.train_step(iterator)
    moved = before - table.numpy()
    clear = np.abs(gradient) > 1e-5
    # Rows 0-3 are used, by both stacks (a weight's gradient may still be ~0 by chance).
    assert clear[:4].mean() > 0.9 and not gradient[4:].any()
    np.testing.assert_allclose(moved[clear], lr * np.sign(gradient[clear]), rtol=1e-3)
    norm = np.sqrt(sum(float(np.sum(np.square(g))) for g in grads))
    assert float(metrics["grad_norm"]) == pytest.approx(norm, rel=1e-5)


@pytest.mark.parametrize("clip_ratio, loss_scale", [(0.25, None), (4.0, None), (0.25, 1024.0)])
def test_clip_norm_scales_the_update_to_the_global_norm(clip_ratio, loss_scale):
    # With SGD at learning rate 1 a weight moves by minus the gradient it is given: the loop's
    # gradient g scaled by min(1, clip / |g|), the reference computed here in float64. Under
    # fp16 loss scaling the gradients are scaled, and the norm reported and clipped to is
    # still that of the unscaled ones.
    batch = {"source": np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32"),
             "target_in": np.array([[2, 5, 6, 7], [2, 8, 9, 0]], "int32"),
             "target_out": np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32")}
    keras.utils.set_random_seed(0)
    model = Transformer(vocab_size=30, **TINY)
    model.build()
    strategy = tf.distribute.get_strategy()
    optimizer = keras.optimizers.SGD(learning_rate=1.0)
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=loss_scale)
    optimizer.build(model.trainable_variables)
    trainer = Trainer(model, optimizer, strategy)
    _, _, _, grads = strategy.run(trainer.replica_gradients, args=([batch],))
    grads = [g.numpy().astype(np.float64) / (loss_scale or 1.0) for g in grads]
    norm = np.sqrt(sum(np.sum(g * g) for g in grads))
    clip = trainer.clip_norm = clip_ratio * norm
    before = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    metrics = trainer.train_step(iter(tf.data.Dataset.from_tensors(batch).repeat()))
    assert float(metrics["grad_norm"]) == pytest.approx(norm, rel=1e-5)  # before clipping
    factor = min(1.0, clip / norm)
    moved = [b - v.numpy() for b, v in zip(before, model.trainable_variables)]
    assert np.sqrt(sum(np.sum(m * m) for m in moved)) == pytest.approx(min(norm, clip), rel=1e-4)
    for m, g in zip(moved, grads):
        np.testing.assert_allclose(m, factor * g, atol=1e-6)


def test_accumulating_micro_batches_equals_one_large_batch():
    rng = np.random.default_rng(1)
    target = rng.integers(4, 30, size=(4, 5)).astype("int32")
    target[0, 1:] = 0  # micro-batches with different token counts
    batch = {"source": rng.integers(4, 30, size=(4, 6)).astype("int32"),
             "target_in": np.concatenate([np.full((4, 1), 2, "int32"), target[:, :-1]], 1),
             "target_out": target}
    halves = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
    strategy = tf.distribute.get_strategy()
    model = Transformer(vocab_size=30, **TINY)
    model.build()
    trainer = Trainer(model, paper_adam(64, 10, 1.0, PreReducedAdam), strategy, 0.1)
    loss_1, tokens_1, _, grads_1 = strategy.run(trainer.replica_gradients, args=([batch],))
    loss_2, tokens_2, _, grads_2 = strategy.run(trainer.replica_gradients, args=(halves,))
    assert float(tokens_1) == float(tokens_2) == float((target != 0).sum())
    assert float(loss_2) == pytest.approx(float(loss_1), rel=1e-5)
    for a, b in zip(grads_1, grads_2):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # The update's report over both micro-batches, counted with numpy: target tokens, and the
    # share of the source and target positions the step computed that hold PAD (a real pair's
    # target_in holds as many tokens as its target_out: BOS before, EOS after).
    halves[1]["source"][:, 3:] = 0
    trainer = Trainer(model, paper_adam(64, 10, 1.0, PreReducedAdam), strategy, 0.1,
                      accum_steps=2)
    loss_sum, tokens, _, _ = strategy.run(trainer.replica_gradients, args=(halves,))
    micro_batches = tf.data.Dataset.from_tensors(halves[0]).concatenate(
        tf.data.Dataset.from_tensors(halves[1]))
    metrics = trainer.train_step(iter(micro_batches))
    real = sum(np.count_nonzero(h["source"]) + np.count_nonzero(h["target_out"]) for h in halves)
    positions = sum(h["source"].size + h["target_in"].size for h in halves)
    assert float(metrics["target_tokens"]) == (target != 0).sum()
    assert float(metrics["loss"]) == pytest.approx(float(loss_sum) / float(tokens), rel=1e-5)
    assert float(metrics["padding_fraction"]) == pytest.approx(1 - real / positions, abs=1e-6)


def test_average_checkpoints_is_the_mean(tmp_path):
    model = Transformer(vocab_size=30, **TINY)
    model.build()
    paths, snapshots = [], []
    for i in range(3):
        for variable in model.trainable_variables:
            variable.assign(tf.random.normal(variable.shape))
        snapshots.append([v.numpy() for v in model.trainable_variables])
        paths.append(tf.train.Checkpoint(model=model).write(str(tmp_path / f"ckpt-{i}")))
    averaged = average_checkpoints(model, paths, str(tmp_path / "averaged" / "ckpt-avg"))
    fresh = Transformer(vocab_size=30, **TINY)
    fresh.build()
    tf.train.Checkpoint(model=fresh).read(averaged).expect_partial()
    for i, variable in enumerate(fresh.trainable_variables):
        np.testing.assert_allclose(variable.numpy(), np.mean([s[i] for s in snapshots], 0),
                                   rtol=1e-5, atol=1e-6)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    model = Transformer(vocab_size=30, **TINY)
    model.build()
    optimizer = paper_adam(64, 10)
    optimizer.build(model.trainable_variables)
    keeper = CheckpointKeeper(str(tmp_path), model, optimizer, keep=3)
    keeper.save(1)
    good = [v.numpy() for v in model.trainable_variables]
    for variable in model.trainable_variables:
        variable.assign_add(tf.ones_like(variable))
    latest = keeper.save(2)
    with open(latest + ".data-00000-of-00001", "r+b") as f:
        f.truncate(100)  # a half-written data file
    assert keeper.restore().endswith("ckpt-1")
    assert "does not read back" in caplog.text
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), good[0])
    # None reads back: an error, never a start from scratch over the run's checkpoints.
    with open(os.path.join(str(tmp_path), "ckpt-1.data-00000-of-00001"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(ModelDirError, match="no checkpoint in .* reads back; none was changed"):
        keeper.restore()
    assert sorted(checkpoint_prefixes(str(tmp_path))) == [str(tmp_path / "ckpt-1"),
                                                         str(tmp_path / "ckpt-2")]


def events(directory, steps=None):
    """{tag: its description} of the summaries in a directory's event files; `steps`, a dict,
    gets {tag: [the steps it was written at]}."""
    tags = {}
    for name in os.listdir(directory):
        if name.startswith("events.out.tfevents"):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
                for value in event.summary.value:
                    tags.setdefault(value.tag, value.metadata.summary_description)
                    if steps is not None:
                        steps.setdefault(value.tag, []).append(event.step)
    return tags


def image_bytes(directory, tag):
    """The PNG bytes of the last image summary `tag` in a directory's event files."""
    found = None
    for name in sorted(os.listdir(directory)):
        if name.startswith("events.out.tfevents"):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
                for value in event.summary.value:
                    if value.tag == tag:  # [width, height, png] strings
                        found = tf.make_ndarray(value.tensor)[2]
    assert found is not None, tag
    return found


def test_train_py_end_to_end(small_corpus, tmp_path):
    # A relative model_dir, as users type it (paths must not be joined twice). With a test
    # split (its own data dir: the shared one was prepared without it), the run ends with the
    # report on it.
    test_tsv = tmp_path / "test.tsv"
    test_tsv.write_text("".join(open(small_corpus["dev"]).readlines()[:12]), encoding="utf-8")
    result = python(*train_flags(small_corpus, None, "run", test_files=str(test_tsv),
                                 alpha=None), cwd=str(tmp_path))
    model_dir = str(tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step     12/12 | loss" in result.stdout and "tgt tok/s | RSS " in result.stdout
    # train.py's kernels (tests/test_cpu_kernels.py checks that TensorFlow runs them).
    kernels = cpu_kernels.use_onednn(cpu_kernels.user_environment())
    assert f"; CPU kernels: {kernels}" in result.stdout
    # Tokenizing and searching log no spurious oneDNN error (int Transposes) where it runs.
    assert "oneDNN supports DT_" not in result.stderr
    assert "averaged 3 checkpoints" in result.stdout and "dev sacreBLEU" in result.stdout
    assert "warm-up" not in result.stdout  # 12 updates, past the 5 of warm-up
    # The pairs --max_length=64 leaves out, counted with the sentencepiece package: more than
    # 63 subwords on a side (then EOS, or BOS).
    pieces = sentencepiece.SentencePieceProcessor(model_file=os.path.join(model_dir,
                                                                          "spm.model"))
    counts = []
    for split in ("train", "dev"):
        with open(small_corpus[split], encoding="utf-8") as f:
            pairs = [line.rstrip("\n").split("\t")[:2] for line in f]
        lengths = [max(len(pieces.encode(s)), len(pieces.encode(t))) + 1 for s, t in pairs]
        counts.append((sum(n > 64 for n in lengths), len(pairs)))
    (train_long, train_pairs), (dev_long, dev_pairs) = counts
    assert train_long > 100 and dev_long > 10
    assert (f"max_length=64 leaves out {train_long:,} of the {train_pairs:,} training pairs and "
            f"{dev_long} of the {dev_pairs} dev pairs (more than 64 subwords on a side, EOS or "
            "BOS included): raise --max_length to keep them") in result.stdout
    report = json.load(open(os.path.join(model_dir, "report.json")))
    test = report["test"]
    assert test["sentences"] == 12 and test["beam_size"] == 4
    # Its translations, kept for comparisons (evaluate.py --baseline), score what it reports.
    assert test["translations"] == "test.hyp"
    with open(os.path.join(model_dir, "test.hyp"), encoding="utf-8") as f:
        translations = f.read().split("\n")
    assert len(translations) == 13 and translations[-1] == ""  # 12 lines, each ended
    references = [line.rstrip("\n").split("\t")[1] for line in open(test_tsv, encoding="utf-8")]
    assert sacrebleu.corpus_bleu(translations[:12], [references]).score == pytest.approx(
        test["bleu"])
    assert (f"  translations in {os.path.join('run', 'test.hyp')} (evaluate.py --baseline "
            "compares another model's with them)") in result.stdout

    def repeat_three_words(line):
        words = line.split()
        return max(collections.Counter(zip(words, words[1:], words[2:])).values(), default=0) > 1

    repeats = {"words": 3, "translations": sum(map(repeat_three_words, translations)),
               "references": sum(map(repeat_three_words, references))}
    assert test["repeating"] == repeats
    hint = (f"  {repeats['translations']} of them repeat a sequence of 3 words "
            f"({repeats['references']} of the references do): --no_repeat_ngram_size=4")
    assert (hint in result.stdout) == (repeats["translations"] > max(2 * repeats["references"],
                                                                     12 / 20)), result.stdout
    assert test["checkpoint"] == os.path.join("averaged", "ckpt-12")  # what export.py exports
    # The length penalty: chosen on dev for that checkpoint, kept for export.py and the others.
    choice = json.load(open(os.path.join(model_dir, "decoding.json")))
    assert choice["chosen_on"] == "dev" and choice["checkpoint"] == test["checkpoint"]
    tried = {float(a): bleu for a, bleu in choice["dev_bleu"].items()}
    assert list(tried) == list(length_penalty.ALPHA_GRID[:len(tried)])
    assert choice["alpha"] == test["alpha"] == max(tried, key=tried.get)
    assert (f"length penalty: {test['alpha']:g}, chosen on dev (beam 4, sacreBLEU "
            f"0.6: {tried[0.6]:.2f}") in result.stdout
    assert (f"test (12 sentences, beam 4, length penalty {test['alpha']:g}, "
            f"{test['checkpoint']}): sacreBLEU {test['bleu']:.2f}") in result.stdout
    # Its sources longer than the model reads (63 subwords, then EOS), as the sentencepiece
    # package counts them, are counted.
    test_sources = [line.split("\t")[0] for line in test_tsv.open(encoding="utf-8")]
    cut = sum(len(pieces.encode(s)) > 63 for s in test_sources)
    assert test["sources_cut"] == cut > 0
    assert (f"  {cut} of the sources are longer than the model reads (max_length - 1 "
            "subwords): their translations cover their start only") in result.stdout
    assert test["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    pairs = [[side.strip() for side in line.split("\t")[:2]]
             for line in test_tsv.open(encoding="utf-8")]
    assert len(test["samples"]) == 3
    for sample in test["samples"]:
        assert [sample["source"], sample["reference"]] in pairs
        assert f"  translation  {sample['translation']}" in result.stdout
    assert "python export.py --model_dir=run" in result.stdout
    # The sentence to try is the run's own (its shortest sample source, quoted for the shell).
    example = min((sample["source"] for sample in test["samples"]), key=len)
    assert f"  echo {shlex.quote(example)} | python translate.py --export=" in result.stdout
    assert "--source=my.sources --reference=my.references" in result.stdout  # not my.de, my.en
    assert report["dev_greedy"]["bleu"] >= 0
    settings = json.load(open(os.path.join(model_dir, "settings.json")))
    assert settings["model"]["d_model"] == 64 and settings["data"]["vocab_size"] == 600
    assert os.path.exists(os.path.join(model_dir, "spm.model"))
    assert tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")).endswith("ckpt-12")
    # TensorBoard: tags grouped by kind, each scalar with its description; the settings for
    # the HParams tab in the model_dir's own event file.
    train_steps, eval_steps = {}, {}
    train_events = events(os.path.join(model_dir, "train"), train_steps)
    assert set(train_events) >= {"metrics/loss", "optim/learning_rate", "optim/grad_norm",
                                 "system/target_tokens_per_sec", "system/padding_fraction",
                                 "system/rss_gib"}
    eval_events = events(os.path.join(model_dir, "eval"), eval_steps)
    assert set(eval_events) >= {"metrics/loss", "metrics/perplexity", "metrics/accuracy",
                                "metrics/bleu", "metrics/chrf", "samples/translations"}
    assert {tag for tag in eval_events if tag.startswith("samples/attention/")} == {
        f"samples/attention/{kind}/layer_{i}" for i in range(settings["model"]["num_layers"])
        for kind in ("encoder_self", "decoder_self", "decoder_cross")}
    assert "dev split" in eval_events["metrics/perplexity"]
    # Nothing written last is lost at exit: the last logged update (every 4th) and both dev
    # evaluations, at step 8 and of the average at step 12.
    assert sorted(train_steps["metrics/loss"]) == [4, 8, 12]
    assert sorted(eval_steps["metrics/bleu"]) == [8, 12]
    # Attention pictures carry the sentence's pieces as text: black pixels, which no heatmap
    # colour has (its darkest is (25, 76, 178)).
    picture = tf.io.decode_png(image_bytes(os.path.join(model_dir, "eval"),
                                           "samples/attention/decoder_cross/layer_0")).numpy()
    assert picture.shape[2] == 3 and (picture.max(axis=2) < 40).any()
    assert all(train_events[tag] for tag in train_events)  # every scalar is described
    assert "_hparams_/session_start_info" in events(model_dir)
    # The same command again: the run has ended, so its end is printed as reported, not
    # computed again (TensorFlow is not even loaded), and nothing in the model_dir changes.
    before = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
              for d, _, files in os.walk(model_dir) for f in files}
    again = python(*train_flags(small_corpus, None, "run", test_files=str(test_tsv),
                                alpha=None), cwd=str(tmp_path),
                   env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert "tensorflow" not in imported_modules(again.stderr)
    header, *end = again.stdout.strip().splitlines()
    assert header == ("run: this run has done its 12 updates (a larger --train_steps trains it "
                      "further); its end as reported then (report.json: delete it to evaluate "
                      "and report again):")
    reported = result.stdout.strip().splitlines()
    reported = reported[next(i for i, line in enumerate(reported)
                             if line.startswith("dev sacreBLEU")):]
    assert end == [line for line in reported if not line.startswith("length penalty:")]
    assert before == {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
                      for d, _, files in os.walk(model_dir) for f in files}
    # With --no_repeat_ngram_size the end runs again (no more training) with the rule, which
    # decoding.json keeps as export.py's default (and translate.py's and evaluate.py's:
    # tests/test_length_penalty.py).
    ruled = python(*train_flags(small_corpus, None, "run", test_files=str(test_tsv),
                                alpha=None, no_repeat_ngram_size=2), cwd=str(tmp_path))
    assert ruled.returncode == 0, ruled.stderr[-3000:]
    assert not re.search(r"^step ", ruled.stdout, re.M)
    test = json.load(open(os.path.join(model_dir, "report.json")))["test"]
    choice = json.load(open(os.path.join(model_dir, "decoding.json")))
    assert test["no_repeat_ngram_size"] == choice["no_repeat_ngram_size"] == 2
    assert choice["alpha"] == test["alpha"]
    assert (f"length penalty: {test['alpha']:g}, chosen on dev (beam 4, no repeated 2-grams of "
            "subwords, sacreBLEU 0.6: ") in ruled.stdout
    assert (f"test (12 sentences, beam 4, length penalty {test['alpha']:g}, no repeated 2-grams "
            f"of subwords, {test['checkpoint']}): sacreBLEU {test['bleu']:.2f}") in ruled.stdout
    assert "--no_repeat_ngram_size=4 forbids" not in ruled.stdout
    # Left out of the command again, the flag keeps the model_dir's rule: the end as reported.
    kept = python(*train_flags(small_corpus, None, "run", test_files=str(test_tsv), alpha=None),
                  cwd=str(tmp_path))
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "its end as reported then" in kept.stdout
    assert "no repeated 2-grams of subwords" in kept.stdout
    exported = python("export.py", "--model_dir=run", "--check=false", cwd=str(tmp_path))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (f"no repeated sequence of 2 subwords (from {os.path.join('run', 'decoding.json')})"
            in exported.stdout)
    assert "; no translation repeats a sequence of 2 subwords)" in exported.stdout
    converted = python("export.py", "--model_dir=run", "--format=ctranslate2", "--check=false",
                       cwd=str(tmp_path))
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert "and no_repeat_ngram_size=2 (kept as translate.py's default)" in converted.stdout
    with open(os.path.join(model_dir, "ctranslate2", "tfnmt.json")) as f:
        assert json.load(f)["no_repeat_ngram_size"] == 2


def test_tensorboard_shows_a_resumed_runs_steps_once(small_corpus, train_data, tmp_path):
    # A run stopped after its last checkpoint (4) had logged updates 5 and 6; resumed, it logs
    # them again. TensorBoard's Python loader showed both (a curve doubling back); it now reads
    # the resumed run's points only, as the log printed them.
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    model_dir = str(tmp_path / "run")
    flags = dict(log_every=1, checkpoint_every=4, eval_every=0, average_last=0, alpha=0.6,
                 test_report="false")
    first = python(*train_flags(small_corpus, train_data, model_dir, train_steps=6, **flags))
    assert first.returncode == 0, first.stderr[-3000:]
    for name in os.listdir(os.path.join(model_dir, "checkpoints")):
        if name.startswith("ckpt-6."):  # lost: the run resumes from ckpt-4
            os.remove(os.path.join(model_dir, "checkpoints", name))
    resumed = python(*train_flags(small_corpus, train_data, model_dir, train_steps=8, **flags))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from " in resumed.stdout and "ckpt-4 at step 4" in resumed.stdout

    def logged(result):
        return {int(m.group(1)): float(m.group(2))
                for m in re.finditer(r"step +(\d+)/\d+ \| loss ([\d.]+)", result.stdout)}

    expected = {**logged(first), **logged(resumed)}
    assert sorted(expected) == list(range(1, 9)) and logged(first)[5] != logged(resumed)[5]
    loader = EventAccumulator(os.path.join(model_dir, "train"))
    loader.Reload()
    points = [(e.step, float(tf.make_ndarray(e.tensor_proto)))
              for e in loader.Tensors("metrics/loss")]
    assert [step for step, _ in points] == list(range(1, 9))
    for step, value in points:
        assert value == pytest.approx(expected[step], abs=5e-4), step
    # Files of a run that marked no start (written before the mark existed) are cut too.
    from tfnmt.training.summaries import mark_run_start

    directory = str(tmp_path / "unmarked")
    for steps, offset in ((range(1, 7), 0.0), (range(5, 9), 100.0)):
        writer = tf.summary.create_file_writer(directory, filename_suffix=f".{offset:g}")
        if offset:
            mark_run_start(writer, steps[0])
        with writer.as_default():
            for step in steps:
                tf.summary.scalar("loss", step + offset, step=step)
        writer.close()
    loader = EventAccumulator(directory)
    loader.Reload()
    assert [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in loader.Tensors("loss")] \
        == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 105.0), (6, 106.0), (7, 107.0),
            (8, 108.0)]


def train_with_loss_scale(flags, initial_scale, max_skipped_in_a_row=None):
    """train.py with Keras's LossScaleOptimizer starting at `initial_scale`."""
    script = ("import functools, runpy, sys, keras\n"
              "scaled = functools.partial(keras.optimizers.LossScaleOptimizer, "
              f"initial_scale=float({str(initial_scale)!r}))\n"
              "keras.optimizers.LossScaleOptimizer = scaled\n")
    if max_skipped_in_a_row is not None:
        script += ("import tfnmt.training.trainer\n"
                   f"tfnmt.training.trainer.MAX_SKIPPED_IN_A_ROW = {max_skipped_in_a_row}\n")
    script += (f"sys.argv = {flags!r}\n"
               "runpy.run_path('train.py', run_name='__main__')\n")
    # Eigen's kernels: on CPUs with AVX512-FP16, oneDNN's float16 ones trained 12-32x slower
    # (bench/README.md, "fp16 on CPUs"); this test is about the loss scale, not kernels.
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0"))


def test_fp16_skipped_updates_are_not_counted_as_steps(small_corpus, train_data, tmp_path):
    # A loss scale of 2^30 overflows float16 gradients: Keras's LossScaleOptimizer skips those
    # updates (and halves the scale) without counting them. The run must still apply
    # --train_steps updates, and each checkpoint's number must be the optimizer's count.
    overrides = dict(train_steps=4, checkpoint_every=2, log_every=2, eval_every=0,
                     bleu_sentences=2, average_last=0, mixed_precision="fp16")
    flags = train_flags(small_corpus, train_data, str(tmp_path / "run"), **overrides)
    result = train_with_loss_scale(flags, 2.0 ** 30)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "overflowing updates skipped" in result.stdout
    assert "fp16 is a GPU precision" in result.stdout  # the suite has no GPU
    checkpoints = os.path.join(tmp_path, "run", "checkpoints")
    assert tf.train.latest_checkpoint(checkpoints).endswith("ckpt-4")
    for number in (2, 4):
        reader = tf.train.load_checkpoint(os.path.join(checkpoints, f"ckpt-{number}"))
        # LossScaleOptimizer.iterations is its inner optimizer's count (its own stays unused).
        count = reader.get_tensor(
            "optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")
        assert int(count) == number

    # Gradients that stay non-finite at every scale (here: an infinite one) are divergence:
    # one line and exit 1 after MAX_SKIPPED_IN_A_ROW skips, not an endless loop.
    flags = train_flags(small_corpus, train_data, str(tmp_path / "diverged"), **overrides)
    result = train_with_loss_scale(flags, float("inf"), max_skipped_in_a_row=3)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "train.py: step 1: 4 updates in a row had non-finite gradients at every loss scale; the "
        "loss has diverged (lower --lr_scale or use --mixed_precision=bf16|none)")


def test_a_diverged_loss_stops_the_run_before_its_update_is_saved(small_corpus, train_data,
                                                                 tmp_path):
    # A learning rate of ~1e29 (finite, so allowed) blows the weights up at the first update:
    # the loss of a later one is not finite. The run stops there in one line, saving nothing
    # of it: a run going on would save NaN weights every --checkpoint_every updates and
    # rotate the good checkpoints away.
    model_dir = tmp_path / "run"
    flags = train_flags(small_corpus, train_data, str(model_dir), train_steps=6,
                        checkpoint_every=1, log_every=1, eval_every=0, average_last=0,
                        warmup_steps=1, lr_scale=1e30, test_report="false")
    result = python(*flags)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    diverged = re.fullmatch(
        r"train.py: step (\d): loss (\S+), gradient norm (\S+): training has diverged; this "
        r"update was not saved, and the checkpoints before it are kept \(newest: (\S+)\)\. "
        r"Resume with --clip_norm \(e\.g\. 1\.0\), or train a new --model_dir with a lower "
        r"--lr_scale", last)
    assert diverged, last
    step, loss, grad_norm, newest = diverged.groups()
    assert not (math.isfinite(float(loss)) and math.isfinite(float(grad_norm)))
    checkpoints = model_dir / "checkpoints"
    assert newest == str(checkpoints / f"ckpt-{int(step) - 1}")
    assert tf.train.latest_checkpoint(str(checkpoints)) == newest
    reader = tf.train.load_checkpoint(newest)  # its weights finite, as saved
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.isfinite(value).all(), name


def test_a_run_that_ends_within_its_warmup_says_so(small_corpus, train_data, tmp_path):
    # The learning rate still rises at the last update of a fixed number of updates: said (a
    # time budget's plan shortens the warm-up instead); a run whose last update is its
    # warm-up's (the peak) is silent.
    from tfnmt.training.experiment import _within_warmup

    quick = dict(log_every=2, checkpoint_every=1000, eval_every=0, bleu_sentences=2,
                 average_last=0, test_report="false")
    fixed = python(*train_flags(small_corpus, train_data, str(tmp_path / "fixed"),
                                train_steps=4, warmup_steps=6, **quick))
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert ("warning: the run's 4 updates end within its 6-update warm-up (--warmup_steps): "
            "its learning rate rises to the last one and never reaches its peak; a "
            "--warmup_steps of a tenth of the updates or so trains the model\n") in fixed.stdout
    rates = [float(r) for r in re.findall(r"^step +\d+/4 \| loss \S+ \| lr (\S+) ",
                                          fixed.stdout, re.M)]
    assert rates == sorted(rates) and len(rates) == 2  # rising to the end
    assert _within_warmup({"warmup_steps": 6}, 6) is None
    assert _within_warmup({"warmup_steps": 6}, 5).startswith(
        "warning: the run's 5 updates end within its 6-update warm-up")


def test_a_time_budget_plans_the_run_and_a_resumed_run_keeps_the_plan(small_corpus, train_data,
                                                                     tmp_path):
    # 24 seconds of training: the number of updates is planned from their pace. A run
    # stopped while its plan can still change (Ctrl-C here, at its first logged update, well
    # before the plan stays at 12 s even where tracing the step is slow) plans again when
    # resumed, for what is left of the budget; the plan then stays (saved), the linear decay
    # ends at the planned last update (its rate is the last non-zero one), and running the
    # command again resumes the finished run instead of training on.
    model_dir = str(tmp_path / "run")
    checkpoints = os.path.join(model_dir, "checkpoints")
    flags = train_flags(small_corpus, train_data, model_dir, train_steps=None,
                        train_minutes=0.4, lr_decay="linear", warmup_steps=5, log_every=10,
                        checkpoint_every=1000, eval_every=0, bleu_sentences=2,
                        average_last=0, test_report="false")
    process = started(*flags)
    try:
        for line in process.stdout:
            if line.startswith(("step ", "planning ", "planned ")):
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert line.startswith("step ") and process.returncode == 130, line + err[-3000:]
    stopped = int(re.search(r"^stopped by SIGINT after step (\d+)", out, re.M)[1])
    reader = tf.train.load_checkpoint(os.path.join(checkpoints, f"ckpt-{stopped}"))
    spent = float(reader.get_tensor("budget_seconds/.ATTRIBUTES/VARIABLE_VALUE"))
    assert 0.0 < spent < 12.0
    result = python(*flags)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"resumed within the time budget: {spent / 60:.2f} of 0.4 minutes trained; "
            "planning the rest from this run's pace") in result.stdout
    planned = re.findall(r"^planned ([\d,]+) updates for 0.4 minutes of training$",
                         result.stdout, re.M)
    assert len(planned) == 1, result.stdout[-3000:]
    steps = int(planned[0].replace(",", ""))
    assert steps >= stopped + 40  # settled (30 updates), then a pace, then half of the budget
    last = re.search(rf"^step {steps:6d}/{steps} \| loss [\d.]+ \| lr (\S+) ", result.stdout, re.M)
    assert last and float(last.group(1)) == 0.0  # the decay ended at the planned update
    settings = json.load(open(os.path.join(model_dir, "settings.json")))
    assert settings["train"]["train_steps"] == steps and settings["train"]["train_minutes"] == 0.4
    assert tf.train.latest_checkpoint(checkpoints).endswith(f"ckpt-{steps}")
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(checkpoints))
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == steps
    assert float(reader.get_tensor("budget_seconds/.ATTRIBUTES/VARIABLE_VALUE")) == -1.0
    # TensorBoard's HParams tab shows a run's first settings only: the model_dir holds one
    # event file of them, with the planned length (not the tiny preset's 800 it started with).
    assert hparams(model_dir)["train.train_steps"] == steps
    again = python("train.py", f"--model_dir={model_dir}", f"--data_dir={train_data}",
                   "--alpha=0.6")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout and f"at step {steps}" in again.stdout
    assert "planned" not in again.stdout and "planning" not in again.stdout
    assert hparams(model_dir)["train.train_steps"] == steps


def hparams(model_dir):
    """{name: value} of the settings TensorBoard's HParams tab shows for a model_dir, from its
    own event files (which must hold one set)."""
    from tensorboard.plugins.hparams import metadata

    found = []
    for name in os.listdir(model_dir):
        if name.startswith("events.out.tfevents"):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(model_dir, name)):
                for value in event.summary.value:
                    if value.tag == metadata.SESSION_START_INFO_TAG:
                        info = metadata.parse_session_start_info_plugin_data(
                            value.metadata.plugin_data.content)
                        found.append({k: getattr(v, v.WhichOneof("kind"))
                                      for k, v in info.hparams.items()})
    assert len(found) == 1, found
    return found[0]


def test_late_dropout_starts_at_its_epoch_and_a_resumed_run_at_the_same_update(
        small_corpus, train_data, tmp_path):
    # --dropout_from_epoch: the start is measured from the first 100 updates (each <= 512 target
    # tokens here), saved, and a resumed run starts dropout at that update.
    epoch_tokens = records.load_manifest(train_data)["splits"]["train"]
    epoch_tokens = epoch_tokens["tokens"]["target"] + epoch_tokens["examples"]
    epochs = 130 * 400 / epoch_tokens  # starts after 102-239 updates of 218-512 tokens
    model_dir = str(tmp_path / "run")
    flags = train_flags(small_corpus, train_data, model_dir, train_steps=101, dropout=0.1,
                        dropout_from_epoch=epochs, log_every=50, checkpoint_every=101,
                        eval_every=0, bleu_sentences=2, average_last=0, test_report="false")
    first = python(*flags)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = json.load(open(os.path.join(model_dir, "settings.json")))["train"]
    start = saved["dropout_from_step"]
    assert 101 < start < 240 and saved["dropout_from_epoch"] == pytest.approx(epochs)
    assert f"dropout 0.1 starts at update {start:,d}" in first.stdout
    assert "dropout 0.1 on" not in first.stdout
    resumed = python("train.py", f"--model_dir={model_dir}", f"--data_dir={train_data}",
                     f"--train_steps={start + 1}", "--alpha=0.6")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.findall(r"^step ([\d,]+): dropout 0.1 on$", resumed.stdout, re.M) == [str(start)]
    assert "starts at update" not in resumed.stdout


def test_every_flag_at_once_trains_resumes_and_exports_a_translator(small_corpus, tmp_path):
    # English to German (--reverse), separate source/target vocabularies (and so embeddings),
    # pre-norm, learned positions, GELU, FFN dropout, a shallower decoder, an untied output
    # layer, clipping, linear decay, subword sampling, BLEU on characters, beam dev
    # evaluations without repeats, 2 micro-batches, 2 replicas at once, then stock ops on one
    # device
    # (test_gradients_equal_plain_autodiff_under_every_model_flag_and_strategy checks their
    # gradients in every combination; test_train_py_end_to_end runs the defaults).
    import ctranslate2
    import sentencepiece
    import tensorflow_text  # noqa: F401

    from tfnmt.checkpoints import load_model
    from tfnmt.data.special_tokens import EOS_ID, PAD_ID
    from tfnmt.inference import ctranslate2_translator
    from tfnmt.inference.ctranslate2_export import export_ctranslate2
    from tfnmt.inference.greedy_search import greedy_decode
    from tfnmt.inference.saved_model import export_saved_model
    from tfnmt.inference.serving import TranslationModule

    model_dir = str(tmp_path / "run")
    overrides = dict(train_steps=1, checkpoint_every=1, log_every=1, eval_every=0,
                     bleu_sentences=2, average_last=0, norm_first=True, position="learned",
                     separate_vocabularies="true", vocab_size=500, accum_steps=2,
                     strategy="mirrored", cpu_devices=2, activation="gelu", ffn_dropout=0.1,
                     num_layers=None, num_decoder_layers=1, tie_output="false", clip_norm=1.0,
                     lr_decay="linear", warmup_steps=1, subword_alpha=0.1, subword_nbest=-1,
                     reverse="true", bleu_tokenize="char", eval_beam_size=2,
                     no_repeat_ngram_size=2)
    first = python(*train_flags(small_corpus, None, model_dir, **overrides))
    assert first.returncode == 0, first.stderr[-3000:]
    # Dev translated by beam search under the run's no-repeat rule (test_length_penalty.py
    # checks the rule reaches the evaluation's search).
    assert "(beam 2, no repeated 2-grams of subwords)" in first.stdout
    assert "2 replica(s)" in first.stdout and "step      1/1 | loss" in first.stdout
    assert "Using MirroredStrategy eagerly" not in first.stderr  # a warning of TensorFlow's
    assert "vocabulary 500 source, 500 target" in first.stdout
    chosen = re.search(r"precision (bf16|none) \(auto: (?:bf16 products timed (\d+\.\d\d)x "
                       r"float32's|no native bf16 on this CPU)\)", first.stdout)
    assert chosen, first.stdout[:2000]  # the log says what auto chose and why
    assert chosen[1] == ("bf16" if chosen[2] and float(chosen[2]) >= 1.15 else "none")
    assert "| lr 0.00e+00 |" in first.stdout  # the rate after the last step (Noam's: 8.84e-02)
    with open(os.path.join(model_dir, "settings.json")) as f:
        saved = json.load(f)["train"]
    assert (saved["subword_alpha"], saved["subword_nbest"]) == (0.1, -1)
    # The character pairs of the first 1,000 training pairs' sides, English the source here
    # (translate.py and evaluate.py tell input in the other language by them).
    with open(small_corpus["train"], encoding="utf-8") as f:
        first_pairs = [line.rstrip("\n").split("\t")[:2] for line in f][:1000]
    expected = [collections.Counter(f" {t.lower()} "[i:i + 2] for t in side
                                    for i in range(len(t) + 1)) for side in zip(*first_pairs)]
    assert side_order.read_profiles(os.path.join(model_dir, side_order.PROFILE_FILE)) == {
        "source": expected[1], "target": expected[0]}
    # The final dev evaluation's BLEU, the best checkpoint's, counted on characters.
    assert saved["bleu_tokenize"] == "char"
    with open(os.path.join(model_dir, "best", "best.json")) as f:
        assert json.load(f)["bleu_tokenize"] == "char"
    # Resumed on one device with stock ops: the same variables, so the checkpoint the two
    # replicas' fast ops wrote reads back.
    resumed = python(*train_flags(small_corpus, None, model_dir, **dict(
        overrides, train_steps=2, strategy=None, cpu_devices=None)), "--plain_ops")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 replica(s)" in resumed.stdout
    # The global batch halves (--batch_tokens 512 is per replica; 2 micro-batches an update),
    # and the log says so.
    assert ("the run trained with 2 replica(s) and goes on with 1: an update now takes up to "
            "1,024 tokens (it took 2,048; --batch_tokens is per replica)") in resumed.stdout
    assert "ckpt-1 at step 1" in resumed.stdout and "step      2/2 | loss" in resumed.stdout
    assert "stock ops (--plain_ops)" in resumed.stdout
    # The resumed run cannot raise its model's max_length, so the pairs left out say how to
    # keep them otherwise.
    assert ("this run's model reads no more; a new --model_dir with a larger --max_length "
            "keeps them") in resumed.stdout and "raise --max_length" in first.stdout
    model, vocab, path = load_model(model_dir, "latest")
    assert path.endswith("ckpt-2")
    assert model.settings["norm_first"] and model.settings["position"] == "learned"
    assert not model.settings["share_embeddings"] and not vocab.shared
    for side, name in (("source", "source_embedding"), ("target", "target_embedding")):
        with open(os.path.join(model_dir, f"{side}.spm.model"), "rb") as f:
            assert getattr(vocab, side) == f.read()
        assert getattr(model, name).embeddings.shape == (500, 64)
    assert not os.path.exists(os.path.join(model_dir, "spm.model"))
    assert model.source_embedding is not model.target_embedding
    # The source vocabulary was learned on the English side, the target one on the German.
    source_sp, target_sp = (sentencepiece.SentencePieceProcessor(model_proto=p) for p in vocab)
    for sp, known, unknown in ((source_sp, "\u2581God", "\u2581Gott"),
                               (target_sp, "\u2581Gott", "\u2581God")):
        assert sp.piece_to_id(known) != sp.unk_id() and sp.piece_to_id(unknown) == sp.unk_id()
    assert model.settings["activation"] == "gelu" and model.settings["ffn_dropout"] == 0.1
    assert (model.settings["num_encoder_layers"], model.settings["num_decoder_layers"]) == (2, 1)
    assert not model.settings["tie_output"]
    module = TranslationModule(model, vocab, beam_size=2, n_best=1, no_repeat_ngram_size=2)
    # Published only after TensorFlow's C++ loader ran every signature (ExportCheckError else),
    # here beam searches that repeat no two subwords.
    exported = export_saved_model(module, str(tmp_path / "export"))
    assert os.path.basename(exported) == "1"
    # Sources through the source model, targets through the target model: forced decoding
    # equals numpy's log-probability over the logits (sentencepiece package's pieces), and a
    # forced prefix comes back verbatim.
    pairs = [("And God said.", "Und Gott sprach."), ("The house is small.", "Das Haus")]
    scored = module.score(tf.constant([s for s, _ in pairs]), tf.constant([t for _, t in pairs]))
    for (source, target), score in zip(pairs, scored["scores"].numpy()):
        assert score == pytest.approx(teacher_forced_log_prob(model, vocab, source, target)[0],
                                      rel=1e-4, abs=1e-4)
    prefixed = module.serve_with_prefix(tf.constant(["And God said."]),
                                        tf.constant(["Und Gott sprach"]))
    assert prefixed["translations"].numpy()[0].decode().startswith("Und Gott sprach")
    # CTranslate2 with source_vocabulary.json and target_vocabulary.json finds the same
    # greedy translations.
    ct2_dir = export_ctranslate2(model, vocab, str(tmp_path / "ct2"))
    assert {"source_vocabulary.json", "target_vocabulary.json", "source.spm.model",
            "target.spm.model"} <= set(os.listdir(ct2_dir))
    pieces = [source_sp.encode(s, out_type=str) for s, _ in pairs]
    source_ids = tf.ragged.constant([source_sp.encode(s) + [EOS_ID] for s, _ in pairs])
    ids, _ = greedy_decode(model, source_ids.to_tensor(PAD_ID), max_length=10)
    ours = [[target_sp.id_to_piece(int(i)) for i in row if i not in (PAD_ID, EOS_ID)]
            for row in ids.numpy()]
    theirs = ctranslate2.Translator(ct2_dir, device="cpu", compute_type="float32") \
        .translate_batch(pieces, beam_size=1, max_decoding_length=10, min_decoding_length=0)
    assert [r.hypotheses[0] for r in theirs] == ours
    # translate.py's CTranslate2 functions: the source side's SentencePiece model tokenizes,
    # the target side's detokenizes, the search runs to the model's max_length.
    texts, _ = ctranslate2_translator.load_signatures(ct2_dir, beam_size=1)["serving_default"](
        [s for s, _ in pairs])
    ids, _ = greedy_decode(model, source_ids.to_tensor(PAD_ID), max_length=model.max_length)
    assert [t.decode("utf-8") for t in texts] == [
        target_sp.decode([int(i) for i in row if i not in (PAD_ID, EOS_ID)]) for row in ids.numpy()]


@pytest.mark.parametrize("flag, message", [
    ("--batch_tokens=-5", "--batch_tokens must be positive"),
    ("--strategy=gpu_magic", "strategy"),
    ("--label_smoothing=1.5", "label_smoothing must be in"),
    ("--preset=huge", "preset"),
    ("--separate_vocabularies --share_embeddings", "--share_embeddings needs one shared "
     "vocabulary"),
    ("--train_minutes=5 --train_steps=100", "give --train_steps or --train_minutes, not both"),
    ("--train_minutes=5 --strategy=multi_worker", "the workers of a cluster need --train_steps"),
    ("--train_minutes=-1", "--train_minutes must be >= 0 and finite"),
    # An infinite budget, learning rate or bucket width: a traceback, or NaN weights, before.
    ("--train_minutes=inf", "--train_minutes must be >= 0 and finite"),
    ("--lr_scale=inf", "--lr_scale must be positive and finite"),
    ("--bucket_growth=inf", "--bucket_growth must be >= 1.0 and finite"),
    ("--alpha=short", "--alpha: give auto or a finite number >= 0"),
    ("--alpha=inf", "--alpha: give auto or a finite number >= 0"),
    ("--seed=-1", "--seed must be in [0, 2**32)"),  # Keras' seeding: a traceback, before
    ("--seed=4294967296", "--seed must be in [0, 2**32)"),
    ("--vocab_size=3", "--vocab_size must be at least 5 (ids 0-3 are PAD, UNK, BOS and EOS)"),
    ("--subword_alpha=-0.1", "--subword_alpha must be >= 0"),
    ("--subword_nbest=0", "--subword_nbest must be positive or -1"),
    ("--subword_nbest=8", "--subword_nbest is for subword sampling, which --subword_alpha turns "
     "on (it is 0 for this run): give --subword_alpha, or drop --subword_nbest"),
    ("--d_model=66 --num_heads=4", "d_model=66 must be a multiple of num_heads=4"),
    ("--batch_tokens=100", "batch_tokens=100 cannot hold one pair of the maximum length 256"),
    ("--cpu_devices=2", "--cpu_devices=2 splits the CPU for --strategy=mirrored"),
    ("--early_stopping=3", "--early_stopping=3 counts dev evaluations during the run, and "
     "--eval_every is 0"),
    ("--average_last=20", "--average_last=20 averages the last 20 checkpoints, and "
     "--keep_checkpoints=5 keeps 5: raise --keep_checkpoints"),
    # Files given mean --dataset=files (their paths are checked), unless --dataset says
    # otherwise, which would leave them unread.
    ("--train_files=/nonexistent/a.tsv --dev_files=/nonexistent/b.tsv",
     "--train_files: /nonexistent/a.tsv: file not found"),
    ("--test_files=/nonexistent/b.tsv", "--dataset=files (your own corpus) needs --train_files"),
    ("--dataset=embedded --train_files=/nonexistent/a.tsv", "--train_files is for "
     "--dataset=files, and --dataset=embedded reads its own splits: give --dataset=files, or "
     "drop --train_files"),
    ("--train_files=a.tsv --dev_files=b.tsv --tfds_data_dir=/data/tfds", "--tfds_data_dir is "
     "where TFDS datasets are, and --dataset=files reads your files: drop --tfds_data_dir"),
    ("--vocab=a.model,b.model,c.model", "--vocab: one SentencePiece model (shared by both "
     "sides) or two (source,target), got 3"),
    ("--vocab=README.md", "--vocab: README.md is not a SentencePiece model"),
    ("--vocab=a.model --vocab_size=500", "--vocab_size is for a vocabulary learned on the "
     "training data, and --vocab gives one: drop --vocab_size"),
])
def test_bad_flags_fail_fast(flag, message, tmp_path):
    result = python("train.py", f"--model_dir={tmp_path}", *flag.split(), timeout=60,
                    env={"PYTHONPROFILEIMPORTTIME": "1"})
    last_line = result.stderr.strip().splitlines()[-1]  # one line, not a traceback
    assert result.returncode == 1 and last_line.startswith("train.py: ") and message in last_line
    # Refused before TensorFlow loads, but for a batch too small for the data's longest pairs
    # (the data is read with it).
    imported = imported_modules(result.stderr)
    assert "absl.app" in imported
    assert ("tensorflow" in imported) == (flag == "--batch_tokens=100"), flag


def test_a_max_length_no_training_pair_fits_is_refused_before_the_run_starts(
        small_corpus, train_data, tmp_path):
    # Every pair dropped by the length filter: one line (a run would wait for a first batch
    # forever), and no settings.json, so the same model_dir takes a larger --max_length.
    model_dir = tmp_path / "run"
    result = python(*train_flags(small_corpus, train_data, str(model_dir), max_length=4),
                    timeout=120)
    assert result.returncode == 1
    assert re.fullmatch(r"train.py: no pair of the train split fits max_length=4: its shortest "
                        r"is \d+ subwords long \(with EOS or BOS\); raise max_length",
                        result.stderr.strip().splitlines()[-1]), result.stderr[-2000:]
    assert not (model_dir / "settings.json").exists()


def test_flagfile_is_read(tmp_path):
    flagfile = tmp_path / "run.flags"
    flagfile.write_text(f"--model_dir={tmp_path}\n--accum_steps=0\n")
    result = python("train.py", f"--flagfile={flagfile}", timeout=60)
    assert result.returncode != 0 and "--accum_steps must be positive" in result.stderr


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@contextlib.contextmanager
def running_cluster(commands, environments=None, **environment):
    """One train.py process per command line, the workers of one local cluster (worker 0 the
    chief), their output piped; all killed on leaving (a cluster worker ignores SIGTERM).
    `environment`: variables added for every worker; `environments`: for each worker, its own."""
    workers = [f"127.0.0.1:{port}" for port in free_ports(len(commands))]
    processes = []
    for index, args in enumerate(commands):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        own = (environments or [{}] * len(commands))[index]
        processes.append(started(*args, TF_CONFIG=json.dumps(tf_config),
                                 **dict(environment, **own)))
    try:
        yield processes
    finally:
        for p in processes:
            p.kill()
            p.wait()


def finish_cluster(processes):
    """[(stdout, stderr)] of each process once all have ended; asserts that each succeeded
    (either worker's failure shows in the other's: a collective aborted, so both are shown)."""
    outputs = [p.communicate(timeout=300) for p in processes]
    failed = "\n".join(f"worker {index} (exit {p.returncode}):\n{err[-2500:]}"
                        for index, (p, (_, err)) in enumerate(zip(processes, outputs)))
    assert all(p.returncode == 0 for p in processes), failed
    return outputs


def assert_one_set_of_checkpoints(model_dir, name):
    """Asserts that the chief's checkpoint `name` is the newest in the model_dir and that the
    other worker's saves were removed once written."""
    assert tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")).endswith(name)
    assert set(os.listdir(os.path.join(model_dir, "workers", "1"))) <= {".lock"}


def test_two_workers_train_resume_and_refuse_other_settings(small_corpus, train_data,
                                                            tmp_path):
    model_dir = str(tmp_path / "run")
    # An evaluation at step 3 with early stopping on: every worker takes the chief's decision
    # (a collective of both workers), here to go on.
    args = train_flags(small_corpus, train_data, model_dir, strategy="multi_worker",
                       train_steps=6, checkpoint_every=3, eval_every=3, average_last=0,
                       bleu_sentences=4, early_stopping=2)
    # The length penalty chosen on dev at the end: the chief's report takes seconds.
    first = [arg for arg in args if not arg.startswith("--alpha=")]
    # The file a chief of this host ended by a signal mid-check left (test_cluster.py): gone.
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    left = os.path.join(model_dir, cluster_sync.SHARED_FILE.format(
        f"{socket.gethostname()}-{ended.pid}-1"))
    os.makedirs(model_dir)
    open(left, "w").close()
    with running_cluster([first, first], PYTHONUNBUFFERED="1") as (chief, worker):
        chief_lines = []
        for line in chief.stdout:
            chief_lines.append(line)
            if line.startswith("dev sacreBLEU"):  # the chief's final evaluation is done
                break
        # The worker, done at step 6, waits until the chief has reported (had it ended, the
        # chief's coordination service would log mid-report that it crashed): a chief stopped
        # mid-report (Ctrl-C here) is what its worker then says.
        chief.send_signal(signal.SIGINT)
        (chief_out, chief_err), (worker_out, worker_err) = [p.communicate(timeout=120)
                                                            for p in (chief, worker)]
    assert (chief.returncode, chief_err.strip().splitlines()[-1]) == (
        130, "train.py: interrupted"), chief_err[-2500:]
    assert (worker.returncode, worker_err.strip().splitlines()[-1]) == (
        1, "train.py: the chief stopped before the end of its report (its output says why); "
           "this worker's training is complete"), worker_err[-2500:]
    for index, out in enumerate(["".join(chief_lines) + chief_out, worker_out]):
        assert out.startswith(f"joining the cluster as worker {index} of 2 training processes "
                              "(waits until each has started)\n")
        assert "2 replica(s)" in out and "step      6/6" in out and "eval step 3:" in out
    # The chief evaluates the final weights and reports; the other worker only says it is done.
    assert "dev sacreBLEU" not in worker_out
    assert worker_out.strip().splitlines()[-1] == (
        "worker 1 done at step 6; the chief reports the run's dev scores")
    assert not os.path.exists(left)

    assert_one_set_of_checkpoints(model_dir, "ckpt-6")

    # Started with another flag, a worker stops the cluster before any work: every process
    # names the setting (else the worker with fewer updates would end, and the other wait). So
    # does a worker whose --model_dir is not the chief's (its local disk): it would start from
    # scratch while the chief resumes; its settings, read from elsewhere, are not compared.
    local = str(tmp_path / "local")
    commands = [args + ["--train_steps=9"], args + ["--train_steps=12"],
                args + ["--train_steps=10", f"--model_dir={local}"]]
    with running_cluster(commands) as other:
        errors = [p.communicate(timeout=120)[1] for p in other]
    assert [p.returncode for p in other] == [1, 1, 1], "".join(errors)
    shared = "every worker needs its --model_dir and --data_dir on a file system shared with " \
             "the chief"
    assert [err.strip().splitlines()[-1] for err in errors] == [
        "train.py: worker 1 was started with other settings than this chief: --train_steps=12 "
        f"there, 9 here; worker 2 does not find the files of this chief's --model_dir="
        f"{model_dir} in its --model_dir={local} (start every worker with the same flags; "
        f"{shared})",
        "train.py: this worker was started with other settings than the chief: "
        "--train_steps=12 here, 9 on the chief (start every worker with the same flags)",
        f"train.py: this worker does not find the files of the chief's --model_dir={model_dir} "
        f"in its --model_dir={local} ({shared})"]
    assert os.listdir(local) == [] and not any(  # the chief's file was removed
        name.startswith(".cluster-") for name in os.listdir(model_dir))

    # Every worker resumes from the chief's checkpoint, one with no directory of its own too
    # (a new machine), and the workers' weights stay one model (else they would stop: see
    # test_mirrored_two_devices_equal_one_device). That worker's CPU has no bf16 (oneDNN
    # capped at AVX2, where a bf16 product would abort it): where the chief's auto chose bf16,
    # both train in float32.
    shutil.rmtree(os.path.join(model_dir, "workers"))
    with running_cluster([args + ["--train_steps=9"]] * 2,
                         environments=[{}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}]) as processes:
        outputs = finish_cluster(processes)
    for out, _ in outputs:
        assert f"resumed from {model_dir}/checkpoints/ckpt-6 at step 6\n" in out, out
        assert "step      9/9" in out, out
    assert_one_set_of_checkpoints(model_dir, "ckpt-9")
    chief_choice = re.search(r"precision none \(auto: (.*)\)\n", outputs[0][0])
    assert chief_choice, outputs[0][0]
    timed = re.match(r"bf16 products timed (\d+\.\d\d)x float32's", chief_choice[1])
    if timed and float(timed[1]) >= 1.15:  # the chief alone would have trained in bf16
        assert chief_choice[1].endswith("; worker 1 chose none: float32 on every worker")
    else:
        assert chief_choice[1].endswith("; the same on every worker")
    assert "precision none (auto: no native bf16 on this CPU; " in outputs[1][0]


def test_a_cluster_whose_chief_cannot_prepare_the_data_stops_in_one_line(small_corpus,
                                                                         tmp_path):
    # The other worker waits for the chief's data as long as that takes, and stops with the
    # chief's error where it fails (it waited on the data_dir, and then failed on its own).
    with open(small_corpus["train"], "rb") as f:
        lines = f.read().splitlines(keepends=True)
    corpus = tmp_path / "train.tsv"
    corpus.write_bytes(b"".join(lines[:100] + [b"Ein \xff Satz.\tA sentence.\n"] + lines[100:]))
    args = train_flags(dict(small_corpus, train=str(corpus)), None, str(tmp_path / "run"),
                       strategy="multi_worker")
    with running_cluster([args, args]) as processes:
        (_, chief_err), (_, worker_err) = [p.communicate(timeout=120) for p in processes]
    error = f"{corpus}:101: invalid UTF-8 (invalid start byte at byte 4)"
    assert chief_err.strip().splitlines()[-1] == f"train.py: {error}", chief_err[-2500:]
    assert worker_err.strip().splitlines()[-1] == (
        f"train.py: the chief could not prepare the data: {error}"), worker_err[-2500:]
    assert [p.returncode for p in processes] == [1, 1]


def test_a_worker_lost_mid_run_stops_the_other_in_one_line(small_corpus, train_data, tmp_path):
    # A cluster's worker killed while training (SIGKILL: a machine lost) fails the other's next
    # collective: it stops with one line naming the lost worker and its newest checkpoint, not
    # with TensorFlow's traceback.
    model_dir = str(tmp_path / "run")
    args = train_flags(small_corpus, train_data, model_dir, strategy="multi_worker",
                       train_steps=5000, checkpoint_every=4, log_every=4, eval_every=0,
                       average_last=0)
    with running_cluster([args, args], PYTHONUNBUFFERED="1") as (chief, worker):
        for line in chief.stdout:
            if line.startswith("step      8/"):
                break
        worker.kill()
        _, err = chief.communicate(timeout=240)
    assert chief.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert re.fullmatch(
        rf"train\.py: worker 1 of the cluster stopped or cannot be reached; the newest intact "
        rf"checkpoint is {re.escape(model_dir)}/checkpoints/ckpt-\d+ \(start every worker's "
        r"command again to resume from it\)", err.strip().splitlines()[-1]), err[-3000:]


def test_a_stopped_run_names_the_checkpoint_to_resume_from_or_that_there_is_none(tmp_path):
    from tfnmt.training import experiment

    assert experiment._resume_point(str(tmp_path)) == ("no checkpoint has been written yet", "")
    model = tf.Module()
    model.w = tf.Variable(1.0)
    tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt-4"))
    assert experiment._resume_point(str(tmp_path)) == (
        f"the newest intact checkpoint is {tmp_path}/ckpt-4", " to resume from it")


def test_a_seeded_run_does_not_depend_on_whether_its_data_was_prepared(small_prepared, tmp_path,
                                                                     monkeypatch):
    # TFDS builds a dataset the first time it is used and draws Python random numbers as it
    # does; the model's initial weights and dropout seeds (Keras draws them from Python's
    # random) must be those of a run whose data was already there.
    import random

    from tfnmt.data import records
    from tfnmt.training import experiment

    manifest = records.load_manifest(small_prepared)

    def preparing(*args, **kwargs):
        random.random()
        np.random.rand()
        return manifest

    os.makedirs(tmp_path / "run")
    settings = {"model_dir": str(tmp_path / "run"), "model": {},
                "data": {"dataset": "files", "files": None, "vocab_size": 600,
                         "vocab_type": "unigram"}, "train": {"seed": 7}}
    draws = []
    for prepare in (preparing, lambda *args, **kwargs: manifest):
        monkeypatch.setattr(records, "prepare", prepare)
        experiment._prepare_data(settings, tf.distribute.get_strategy(), small_prepared)
        draws.append((random.random(), float(np.random.rand()),
                      keras.random.uniform([3], seed=None).numpy().tolist()))
    assert draws[0] == draws[1]


def test_pairs_left_out_by_max_length_are_told_how_they_could_be_kept(tmp_path):
    from tfnmt.training.experiment import _longer_pairs_advice

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    fresh = {"model": {"position": "learned"}}
    assert _longer_pairs_advice(fresh, str(checkpoints)) == "raise --max_length to keep them"
    # A learned position table holds its source's length, in a fine-tune's first run and after.
    tuned = {"model": {"position": "learned"}, "init_from": {"model_dir": "source"}}
    assert "learned positions of the --init_from model" in \
        _longer_pairs_advice(tuned, str(checkpoints))
    (checkpoints / "ckpt-1.index").write_bytes(b"")
    assert "learned positions of the --init_from model" in \
        _longer_pairs_advice(tuned, str(checkpoints))
    # A run that has trained keeps its model's max_length.
    assert _longer_pairs_advice(fresh, str(checkpoints)).startswith("this run's model reads")
    sinusoidal_tune = {"model": {}, "init_from": {"model_dir": "source"}}
    assert _longer_pairs_advice(sinusoidal_tune, str(checkpoints)).startswith("this run's")


@pytest.mark.parametrize("decay", ["linear", "rsqrt"])
def test_a_run_planned_shorter_than_its_warmup_warms_up_for_a_share_of_it(decay, small_corpus,
                                                                           train_data, tmp_path):
    # A time budget that fits fewer updates than the tiny preset's 800 warm-up updates: the
    # warm-up becomes MAX_WARMUP_SHARE of the planned updates, to the same peak rate (the rate
    # scale falls with the warm-up's square root), saved with the plan, so the run is not all
    # warm-up; under rsqrt it was, and the run only warned.
    from tfnmt.training.experiment import MAX_WARMUP_SHARE

    model_dir = tmp_path / "run"
    result = python(*train_flags(small_corpus, train_data, str(model_dir), train_steps=None,
                                 train_minutes=0.05, warmup_steps=None, lr_decay=decay,
                                 lr_scale=1.0, log_every=2, checkpoint_every=1000, eval_every=0,
                                 bleu_sentences=2, average_last=0, test_report="false"))
    assert result.returncode == 0, result.stderr[-3000:]
    steps = int(re.search(r"^planned ([\d,]+) updates for 0.05 minutes", result.stdout,
                          re.M)[1].replace(",", ""))
    assert steps < 800
    train = json.load(open(model_dir / "settings.json"))["train"]
    assert train["train_steps"] == steps
    warmup = max(1, int(MAX_WARMUP_SHARE * steps))
    assert train["warmup_steps"] == warmup
    assert train["lr_scale"] == pytest.approx((warmup / 800) ** 0.5)
    assert "end within its" not in result.stdout
