"""train.py --init_from: fine-tuning a trained model on new data in a new model_dir."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from helpers import built_once, piece_counts, python, train_flags
from tfnmt.checkpoints import load_model
from tfnmt.data import records
from tfnmt.data.pipeline import make_dataset
from tfnmt.data.vocabulary import Vocabulary
from tfnmt.inference.evaluation import Translator, evaluate_loss
from tfnmt.inference.sacrebleu_scores import corpus_scores
from tfnmt.training import experiment, fine_tune
from tfnmt.training.settings import SettingsError

SIDE_FILES = ["source.spm.model", "target.spm.model"]
# A new domain the source model never saw: two templates with numbers.
TEMPLATES = [("Zimmer {} ist frei.", "Room {} is free."),
             ("Der Zug {} fährt um acht.", "Train {} leaves at eight.")]


def domain_pairs(numbers):
    return [(s.format(n), t.format(n)) for n in numbers for s, t in TEMPLATES]


@pytest.fixture(scope="module")
def source(small_corpus, train_data, tmp_path_factory):
    """A tiny model trained 30 steps on the small corpus (best/ and checkpoints/ kept), trained
    once for all pytest-xdist workers; the tests only read it."""
    def build(model_dir):
        result = python(*train_flags(small_corpus, train_data, model_dir, train_steps=30,
                                     warmup_steps=20, lr_scale=0.3, checkpoint_every=10,
                                     eval_every=0, average_last=0, test_report="false"))
        assert result.returncode == 0, result.stderr[-3000:]

    return built_once(tmp_path_factory, "fine_tune_source", build)


def scores_on(model_dir, pairs, data_dir):
    """(dev perplexity by teacher forcing, chrF of greedy translations, the translations)."""
    model, _, _ = load_model(model_dir)
    vocabulary = Vocabulary.from_dir(model_dir, separate=False)
    perplexity = evaluate_loss(model, make_dataset(data_dir, "dev", 512, 64))["perplexity"]
    hypotheses = Translator(model, vocabulary).translate([s for s, _ in pairs])
    return perplexity, corpus_scores(hypotheses, [t for _, t in pairs])["chrf"], hypotheses


def test_fine_tuning_starts_from_the_source_and_learns_the_new_domain(source, small_corpus,
                                                                      tmp_path):
    train = tmp_path / "domain_train.tsv"
    dev = tmp_path / "domain_dev.tsv"
    train.write_text("".join(f"{s}\t{t}\n" for s, t in domain_pairs(range(100, 250))))
    dev_pairs = domain_pairs(range(300, 310))
    dev.write_text("".join(f"{s}\t{t}\n" for s, t in dev_pairs))
    domain = dict(train_files=str(train), dev_files=str(dev), data_dir=None, eval_every=0,
                  average_last=0, test_report="false", init_from=source)

    # Weights: with a learning rate too small to move float32 weights, the fine-tuned model
    # is the source model (a fresh initialisation would be nowhere near it).
    same = str(tmp_path / "same")
    result = python(*train_flags(small_corpus, None, same,
                                 **dict(domain, train_steps=1, lr_scale=1e-30)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"initialised from {os.path.join(source, 'best', 'ckpt-30')} with a fresh optimizer" \
        in result.stdout
    source_model, source_proto, _ = load_model(source)
    tuned_model, tuned_proto, _ = load_model(same, "latest")
    assert tuned_proto == source_proto  # the new data was tokenized with the source vocabulary
    assert tuned_model.settings == source_model.settings
    for a, b in zip(source_model.weights, tuned_model.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-12)

    # Fine-tuned for 300 float32 steps on the new domain, the model predicts its dev references
    # far better, and its translations move from the source model's to the references (chrF:
    # character n-gram F-score, 0-100; on an AMX Xeon after 150 steps: perplexity 232 -> 2.0
    # and chrF 0 -> 64 with Eigen's kernels and with oneDNN's, but on a Zen 4 EPYC under
    # Eigen chrF 8.8 after 150 steps; 300 pass there with both kernels).
    tuned = str(tmp_path / "tuned")
    result = python(*train_flags(small_corpus, None, tuned, **dict(
        domain, train_steps=300, warmup_steps=40, lr_scale=0.5, log_every=50,
        mixed_precision="none")))
    assert result.returncode == 0, result.stderr[-3000:]
    data = os.path.join(tuned, "data")  # the new domain, tokenized with the source vocabulary
    ppl_before, chrf_before, _ = scores_on(source, dev_pairs, data)
    ppl_after, chrf_after, hypotheses = scores_on(tuned, dev_pairs, data)
    assert ppl_after < ppl_before / 10, (ppl_before, ppl_after)
    assert chrf_after > chrf_before + 20, (chrf_before, chrf_after, hypotheses, ppl_after)


def test_continued_optimizer_and_refusals(source, small_corpus, tmp_path):
    # Each fine-tune prepares its data in its model_dir: tokenized with the source's
    # vocabulary, it is not the shared `train_data`, which other runs read.
    run = str(tmp_path / "continued")
    flags = train_flags(small_corpus, None, run, train_steps=32, eval_every=0,
                        average_last=0, test_report="false", init_from=source,
                        init_optimizer="true")
    result = python(*flags)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"initialised from {os.path.join(source, 'checkpoints', 'ckpt-30')} with its "
            "optimizer at step 30") in result.stdout
    assert "step     32/32 | loss" in result.stdout and "step      4/" not in result.stdout
    # Run again, the same command resumes the new model_dir rather than starting it over.
    again = python(*flags[:-2], "--train_steps=34", *flags[-2:])
    assert again.returncode == 0 and "resumed from" in again.stdout, again.stderr[-3000:]
    # Another source for a model_dir that holds a trained model is refused.
    other = python(*flags[:-2], f"--init_from={os.path.join(source, 'checkpoints', 'ckpt-20')}")
    assert other.returncode == 1 and "holds a trained model already" in other.stderr
    # A continued optimizer already at --train_steps is refused before training.
    late = python(*train_flags(small_corpus, None, str(tmp_path / "late"), train_steps=30,
                               init_from=source, init_optimizer="true"))
    assert late.returncode == 1
    assert "the continued optimizer is at step 30 already" in late.stderr


def test_a_continued_optimizer_past_the_presets_length_trains_for_a_time(source, small_corpus,
                                                                          tmp_path):
    # --train_minutes plans the run from the continued step on. The preset's --train_steps
    # (800 for tiny) stands in until the first plan; a source beyond it was refused, naming a
    # --train_steps the command did not give and could not give with --train_minutes.
    import tensorflow as tf

    late_source = tmp_path / "late_source"
    os.makedirs(late_source / "checkpoints")
    for name in ("settings.json", "spm.model"):
        shutil.copy(os.path.join(source, name), late_source)
    settings = json.load(open(late_source / "settings.json"))
    model, optimizer, _ = experiment._build(settings, tf.distribute.get_strategy(), "none")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    checkpoint.read(os.path.join(source, "checkpoints", "ckpt-30")) \
        .assert_existing_objects_matched()
    optimizer.iterations.assign(900)
    checkpoint.write(str(late_source / "checkpoints" / "ckpt-900"))
    result = python(*train_flags(small_corpus, None, str(tmp_path / "run"),
                                 train_steps=None, train_minutes=0.05, lr_decay="linear",
                                 log_every=10, eval_every=0, average_last=0, test_report="false",
                                 init_from=str(late_source), init_optimizer="true"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with its optimizer at step 900" in result.stdout
    planned = int(re.search(r"^planned ([\d,]+) updates for 0.05 minutes", result.stdout,
                            re.M)[1].replace(",", ""))
    assert planned > 900  # from the continued step on (3 s: it may end at the first update)
    rates = [float(r) for r in re.findall(r"^step +\d+/\d+ \| loss \S+ \| lr (\S+) ",
                                          result.stdout, re.M)]
    assert rates[-1] == 0.0  # decayed to the plan
    assert f"step {planned:6d}/{planned} |" in result.stdout
    before = tf.train.load_checkpoint(str(late_source / "checkpoints" / "ckpt-900"))
    after = tf.train.load_checkpoint(tf.train.latest_checkpoint(tmp_path / "run" / "checkpoints"))
    weights = [name for name in before.get_variable_to_shape_map()
               if name.startswith("optimizer/_trainable_variables/")]
    assert len(weights) > 10 and all(
        not np.array_equal(before.get_tensor(w), after.get_tensor(w)) for w in weights)  # trained


def test_sources_that_cannot_start_a_run(source, tmp_path):
    with pytest.raises(SettingsError, match="neither a model_dir nor a checkpoint"):
        fine_tune.resolve_source(str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="holds weights only"):
        fine_tune.resolve_source(os.path.join(source, "best", "ckpt-30"), optimizer=True)
    with pytest.raises(SettingsError, match="has no settings.json"):
        os.makedirs(tmp_path / "bare")
        fine_tune.resolve_source(str(tmp_path / "bare"))
    requested = {"model": {"num_layers": 3, "dropout": 0.3, "max_length": 64},
                 "data": {"vocab_size": 99, "vocab_type": "bpe"}}
    with pytest.raises(SettingsError, match="num_layers=3 .source: 1."):
        fine_tune.apply_source(requested, {"model.num_layers"}, fine_tune.resolve_source(source))
    settings = fine_tune.apply_source(requested, {"model.dropout"},
                                      fine_tune.resolve_source(source))
    assert settings["model"]["num_layers"] == 1 and settings["model"]["dropout"] == 0.3
    assert settings["data"] == {"vocab_size": 600, "vocab_type": "unigram",
                                "separate_vocabularies": False, "reverse": False,
                                "max_length": 64}
    # The direction is the source's (train.py --reverse) unless given.
    reversed_dir = tmp_path / "reversed"
    reversed_dir.mkdir()
    (reversed_dir / "settings.json").write_text(json.dumps(
        {"model": {"max_length": 64}, "data": {"vocab_size": 600, "vocab_type": "unigram",
                                               "reverse": True}}))
    for explicit, reverse in ((set(), True), ({"data.reverse"}, False)):
        settings = fine_tune.apply_source(dict(requested, data={"reverse": False}), explicit,
                                          {"model_dir": str(reversed_dir)})
        assert settings["data"]["reverse"] is reverse
    # A longer max_length: sinusoidal positions exist at any length; learned ones are a table
    # of max_length rows, which the source checkpoint would not read into.
    longer = dict(requested, model={"max_length": 128})
    settings = fine_tune.apply_source(longer, {"model.max_length"},
                                      fine_tune.resolve_source(source))
    assert settings["model"]["max_length"] == 128  # the source: sinusoidal, 64
    assert settings["data"]["max_length"] == 128  # the pairs trained on fit the positions
    learned = tmp_path / "learned"
    learned.mkdir()
    (learned / "settings.json").write_text(json.dumps(
        {"model": {"position": "learned", "max_length": 64},
         "data": {"vocab_size": 600, "vocab_type": "unigram"}}))
    with pytest.raises(SettingsError, match=r"differs: max_length=128 \(source: 64\); a "
                                            "fine-tuned model keeps its source's shape"):
        fine_tune.apply_source(dict(longer, model={"max_length": 128}), {"model.max_length"},
                               {"model_dir": str(learned)})
    # Without --max_length (train.py's default, 256, is not given) the run trains on pairs
    # that fit its source's 64 positions (it trained on longer ones, which a table of learned
    # positions failed on: "indices[64] = 64 is not in [0, 64)").
    settings = fine_tune.apply_source({"model": {"max_length": 256},
                                       "data": {"max_length": 256}}, set(),
                                      {"model_dir": str(learned)})
    assert settings["model"]["max_length"] == settings["data"]["max_length"] == 64
    # Separate vocabularies (which also unshare the embeddings) are told as the vocabulary.
    with pytest.raises(SettingsError, match="vocabulary differs: separate_vocabularies=True"):
        fine_tune.apply_source(dict(requested, data={"separate_vocabularies": True},
                                    model={"share_embeddings": False}),
                               {"data.separate_vocabularies", "model.share_embeddings"},
                               fine_tune.resolve_source(source))
    # Settings hold what differs from the Transformer's defaults: flags given at those defaults
    # are the source's shape, and other values are told against them.
    at_defaults = {"position": "sinusoidal", "share_embeddings": True, "activation": "relu",
                   "norm_first": False, "tie_output": True}
    settings = fine_tune.apply_source(dict(requested, model=at_defaults),
                                      {f"model.{key}" for key in at_defaults},
                                      fine_tune.resolve_source(source))
    assert settings["model"] == json.load(open(os.path.join(source, "settings.json")))["model"]
    with pytest.raises(SettingsError, match=r"differs: position='learned' \(source: "
                                            r"'sinusoidal'\)"):
        fine_tune.apply_source(dict(requested, model={"position": "learned"}),
                               {"model.position"}, fine_tune.resolve_source(source))


def test_a_model_with_separate_vocabularies_passes_both_on(separate_prepared, small_corpus,
                                                           tmp_path):
    # The source: a model_dir whose vocabulary is two SentencePiece models.
    source_dir = tmp_path / "source"
    os.makedirs(source_dir / "checkpoints")
    (source_dir / "settings.json").write_text(json.dumps(
        {"model": {}, "data": {"vocab_size": 500, "vocab_type": "unigram",
                               "separate_vocabularies": True}}))
    with pytest.raises(SettingsError, match="has no source.spm.model"):
        fine_tune.resolve_source(str(source_dir))
    for name in SIDE_FILES:
        shutil.copyfile(os.path.join(separate_prepared, name), source_dir / name)
    # The new run's data is tokenized with both, and its model_dir gets both.
    settings = {"model_dir": str(tmp_path / "tuned"), "model": {},
                "data": {"dataset": "files", "files": {"train": small_corpus["dev"]},
                         "vocab_size": 500, "vocab_type": "unigram",
                         "separate_vocabularies": True},
                "train": {"seed": 7}, "init_from": {"model_dir": str(source_dir)}}
    os.makedirs(settings["model_dir"])
    data_dir = os.path.join(settings["model_dir"], "data")
    manifest, vocabulary = experiment._prepare_data(settings, tf.distribute.get_strategy(),
                                                    data_dir)
    assert manifest["vocab"]["fingerprint"] == vocabulary.fingerprint == \
        records.load_manifest(separate_prepared)["vocab"]["fingerprint"]
    for name in SIDE_FILES:
        for copy in (settings["model_dir"], data_dir):
            with open(os.path.join(copy, name), "rb") as a, \
                    open(source_dir / name, "rb") as b:
                assert a.read() == b.read()
    assert settings["model"] == {"vocab_size": None, "source_vocab_size": 500,
                                 "target_vocab_size": 500}


def test_fine_tuning_pairs_read_the_other_way_round_are_refused(separate_prepared, small_corpus,
                                                                tmp_path):
    # The source's two models were learned on German (source) and English (target). Fine-tuning
    # it on pairs read the other way round would tokenize each side with the other language's
    # model: refused with the pieces of the first 1,000 pairs (counted with the sentencepiece
    # package) and the flag that reads them its way, before a run starts; not once one has.
    from absl import app
    from absl.testing import flagsaver

    from tfnmt.programs import train, train_data_checks

    source_dir = tmp_path / "source"
    os.makedirs(source_dir)
    for name in SIDE_FILES:
        shutil.copyfile(os.path.join(separate_prepared, name), source_dir / name)
    german_model, english_model = (str(source_dir / name) for name in SIDE_FILES)
    with open(small_corpus["train"], encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t")[:2] for line in f][:1000]
    german, english = [s for s, _ in pairs], [t for _, t in pairs]
    swapped = tmp_path / "en-de.tsv"
    swapped.write_text("".join(f"{t}\t{s}\n" for s, t in pairs), encoding="utf-8")
    evidence = (f"the first 1,000 training sources take {piece_counts(german_model, english):,d}"
                f" pieces with {german_model} but {piece_counts(english_model, english):,d} "
                f"with {english_model}, the targets {piece_counts(english_model, german):,d} with "
                f"{english_model} but {piece_counts(german_model, german):,d} with {german_model}")
    refusal = (f"--init_from={source_dir}: the training pairs look read the other way round "
               f"for its source and target vocabularies: {evidence}: ")
    model_dir = tmp_path / "tuned"
    for train_file, flags, reverse, advice in (
            (small_corpus["train"], [], False, None),
            (str(swapped), [], True, None),
            (small_corpus["train"], ["--reverse"], True, "drop --reverse"),
            (small_corpus["train"], [], True, "give --noreverse"),
            (str(swapped), [], False, "give --reverse (or --train_files and --dev_files with "
             "their sides the other way round)")):
        settings = {"init_from": {"model_dir": str(source_dir)},
                    "data": {"separate_vocabularies": True, "reverse": reverse}}
        with flagsaver.flagsaver():
            train.FLAGS.unparse_flags()
            train.FLAGS(["train.py", f"--model_dir={model_dir}", "--dataset=files",
                         f"--train_files={train_file}", f"--init_from={source_dir}", *flags])
            if advice is None:
                train_data_checks.check_fine_tuning_direction(settings)
                continue
            with pytest.raises(app.UsageError) as refused:
                train_data_checks.check_fine_tuning_direction(settings)
            assert str(refused.value) == refusal + advice
            os.makedirs(model_dir / "checkpoints", exist_ok=True)
            (model_dir / "checkpoints" / "ckpt-8.index").touch()  # a fine-tuning under way
            train_data_checks.check_fine_tuning_direction(settings)
            shutil.rmtree(model_dir)
            shared = dict(settings, data={"separate_vocabularies": False, "reverse": reverse})
            # One model for both sides: no side to have swapped.
            train_data_checks.check_fine_tuning_direction(shared)
