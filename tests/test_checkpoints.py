import gc
import json
import logging
import logging.handlers
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2

from tfnmt.checkpoints import (ModelDirError, best_checkpoint, candidate_checkpoints,
                               checkpoint_prefixes, load_model)
from tfnmt.paths import latest_export
from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer
from tfnmt.training.schedule import paper_adam
from tfnmt.training.trainer import CheckpointKeeper

TINY = dict(get_preset("tiny", dropout=0.0), vocab_size=30)


def new_model():
    model = Transformer(**TINY)
    model.build()
    optimizer = paper_adam(64, 10)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def save_steps(directory, steps, keep=3):
    """Checkpoints at `steps`, the weights shifted by each step; returns the first weight
    matrix as each checkpoint holds it."""
    model, optimizer = new_model()
    keeper = CheckpointKeeper(directory, model, optimizer, keep=keep)
    held = {}
    for step in steps:
        model.trainable_variables[0].assign_add(tf.fill(model.trainable_variables[0].shape,
                                                        float(step)))
        keeper.save(step)
        held[step] = model.trainable_variables[0].numpy()
    return held


@pytest.mark.parametrize("damage", ["junk text", "0xFF byte", "empty", "deleted", "stale",
                                    "older newest"])
def test_a_damaged_state_file_is_rebuilt_and_the_newest_checkpoint_restored(damage, tmp_path,
                                                                           caplog):
    # The state file is an index of the checkpoint files: whatever happens to it, the run
    # resumes from its newest checkpoint and no checkpoint is lost. (With the state file read
    # as is, the manager saw no checkpoint, started at step 0 and rotated the run away.)
    directory = str(tmp_path)
    held = save_steps(directory, [1, 2, 3])
    state = os.path.join(directory, "checkpoint")
    if damage == "junk text":
        open(state, "w").write("these are not the checkpoints\n")
    elif damage == "0xFF byte":
        open(state, "wb").write(b"\xff")
    elif damage == "empty":
        open(state, "w").close()
    elif damage == "deleted":
        os.remove(state)
    elif damage == "stale":  # a kill between the files of ckpt-3 and the state update
        tf.compat.v1.train.update_checkpoint_state(
            directory, os.path.join(directory, "ckpt-2"),
            [os.path.join(directory, f"ckpt-{n}") for n in (1, 2)])
    else:  # every checkpoint listed, an older one named the newest (written by hand)
        open(state, "w").write('model_checkpoint_path: "ckpt-2"\n' + "".join(
            f'all_model_checkpoint_paths: "ckpt-{n}"\n' for n in (1, 2, 3)))
    model, optimizer = new_model()
    with caplog.at_level(logging.WARNING):
        keeper = CheckpointKeeper(directory, model, optimizer, keep=3)
    assert "rebuilt from the 3 checkpoint file(s) there (newest ckpt-3)" in caplog.text
    assert tf.train.latest_checkpoint(directory).endswith("ckpt-3")  # what other tools read
    assert keeper.restore().endswith("ckpt-3")
    np.testing.assert_array_equal(model.trainable_variables[0].numpy(), held[3])
    # Training goes on from there: the next save rotates out the oldest only.
    keeper.save(4)
    assert [os.path.basename(p) for p in checkpoint_prefixes(directory)] == \
        ["ckpt-2", "ckpt-3", "ckpt-4"]
    assert tf.train.latest_checkpoint(directory).endswith("ckpt-4")


def test_a_good_state_file_is_left_alone(tmp_path, caplog):
    save_steps(str(tmp_path), [1, 2])
    before = open(tmp_path / "checkpoint").read()
    with caplog.at_level(logging.WARNING):
        CheckpointKeeper(str(tmp_path), *new_model())
    assert "rebuilt" not in caplog.text and open(tmp_path / "checkpoint").read() == before


class StoppedClockBudget:
    """What a keeper reads of a `TrainingBudget`."""

    def __init__(self, seconds, frozen):
        self.seconds, self.frozen = seconds, frozen

    def elapsed(self):
        return self.seconds


def test_checkpoints_hold_the_training_seconds_of_a_plan_still_revised(tmp_path):
    # A resumed time-budgeted run goes on planning from the seconds saved with its checkpoint:
    # none without a budget, none once the plan stays, none in a checkpoint without the value.
    directory = str(tmp_path / "budget")
    model, optimizer = new_model()
    keeper = CheckpointKeeper(directory, model, optimizer, keep=5)
    keeper.save(1)
    keeper.budget = StoppedClockBudget(61.25, frozen=False)
    keeper.save(2)
    keeper.budget.frozen = True
    keeper.save(3)

    def restored_from(*names):
        """A keeper's restore from copies of checkpoints: `names` are (new number, old name)."""
        target = tmp_path / "restore"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for new, old in names:
            for path in tf.io.gfile.glob(os.path.join(directory, f"{old}.*")):
                shutil.copy(path, target / os.path.basename(path).replace(old, f"ckpt-{new}"))
        reader = CheckpointKeeper(str(target), *new_model())
        return reader, os.path.basename(reader.restore())

    assert [restored_from((1, "ckpt-1"))[0].restored_budget_seconds,
            restored_from((2, "ckpt-2"))[0].restored_budget_seconds,
            restored_from((2, "ckpt-2"), (3, "ckpt-3"))[0].restored_budget_seconds] == \
        [None, 61.25, None]
    # Written before checkpoints held the value: none, also when a newer checkpoint that holds
    # it fails to read back first.
    tf.train.Checkpoint(model=model, optimizer=optimizer).write(os.path.join(directory, "old"))
    copies = [(4, "old"), (5, "ckpt-2")]
    reader, name = restored_from(*copies)
    assert name == "ckpt-5" and reader.restored_budget_seconds == 61.25
    data = tf.io.gfile.glob(str(tmp_path / "restore" / "ckpt-5.data-*"))[0]
    with open(data, "r+b") as damaged:  # the newest one's data file ends early
        damaged.truncate(os.path.getsize(data) // 2)
    reader = CheckpointKeeper(str(tmp_path / "restore"), *new_model())
    assert os.path.basename(reader.restore()) == "ckpt-4"
    assert reader.restored_budget_seconds is None


def model_dir_with_checkpoints(tiny_model_dir, tmp_path, steps):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(os.path.join(tiny_model_dir, "spm.model"), model_dir)
    settings = {"model": dict(TINY, max_length=64)}
    (model_dir / "settings.json").write_text(json.dumps(settings))
    return str(model_dir), save_steps(str(model_dir / "checkpoints"), steps)


def test_models_load_from_the_newest_checkpoint_that_reads_back(tiny_model_dir, tmp_path,
                                                                 caplog):
    # What export.py, translate.py and evaluate.py load: a truncated newest data file, a
    # missing newest index file or a damaged state file fall back, and say which was used.
    model_dir, held = model_dir_with_checkpoints(tiny_model_dir, tmp_path, [1, 2, 3])
    checkpoints = os.path.join(model_dir, "checkpoints")
    open(os.path.join(checkpoints, "checkpoint"), "wb").write(b"\xff")
    model, _, path = load_model(model_dir)
    assert path.endswith("ckpt-3")
    with open(os.path.join(checkpoints, "ckpt-3.data-00000-of-00001"), "r+b") as f:
        f.truncate(100)
    with caplog.at_level(logging.WARNING):
        model, _, path = load_model(model_dir, "latest")
    assert path.endswith("ckpt-2") and "newer checkpoints do not read back (ckpt-3:" in caplog.text
    np.testing.assert_array_equal(model.trainable_variables[0].numpy(), held[2])
    os.remove(os.path.join(checkpoints, "ckpt-2.index"))
    assert load_model(model_dir)[2].endswith("ckpt-1")
    os.remove(os.path.join(checkpoints, "ckpt-1.index"))
    with pytest.raises(ModelDirError, match="no checkpoint of .* reads back"):
        load_model(model_dir)


def training_dir(path, tiny_model_dir, other_vocabulary=False, **changes):
    """A model_dir as train.py leaves it, with one checkpoint of a freshly initialised model
    (and a vocabulary of the same size, with other piece scores, where asked); returns its
    weights."""
    os.makedirs(path)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(open(os.path.join(tiny_model_dir, "spm.model"), "rb").read())
    if other_vocabulary:
        for piece in proto.pieces[4:]:
            piece.score = -piece.score
    (path / "spm.model").write_bytes(proto.SerializeToString())
    model_settings = dict(TINY, **{"max_length": 64, **changes})
    (path / "settings.json").write_text(json.dumps({"model": model_settings}))
    model = Transformer(**model_settings)
    model.build()
    optimizer = paper_adam(64, 10)
    optimizer.build(model.trainable_variables)
    CheckpointKeeper(str(path / "checkpoints"), model, optimizer).save(1)
    return [v.numpy() for v in model.trainable_variables]


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tiny_model_dir, tmp_path):
    # --checkpoint=<another run's checkpoint>: with the same architecture and vocabulary (here
    # only the dropout differs, and the longest input, which sinusoidal positions do not hold
    # as weights) its weights are used; with another vocabulary of the same size,
    # or other layers, the weights would load and translate wrongly without a word; weights of
    # other shapes say so in one line, not under TensorFlow's warning per unread value.
    ours = training_dir(tmp_path / "ours", tiny_model_dir)
    same = training_dir(tmp_path / "same", tiny_model_dir, dropout=0.3, max_length=128)
    model, _, path = load_model(str(tmp_path / "ours"), str(tmp_path / "same" / "checkpoints"))
    assert path == str(tmp_path / "same" / "checkpoints" / "ckpt-1")
    for loaded, theirs, own in zip(model.trainable_variables, same, ours):
        np.testing.assert_array_equal(loaded.numpy(), theirs)
    assert not np.array_equal(same[0], ours[0])
    training_dir(tmp_path / "vocab", tiny_model_dir, other_vocabulary=True)
    training_dir(tmp_path / "layers", tiny_model_dir, position="learned")
    for other, why in (("vocab", r"vocabulary is not .*ours's"),
                       ("layers", r"model is not .*ours's \(position learned there, "
                                  r"sinusoidal here\)")):
        with pytest.raises(ModelDirError, match=f"is a checkpoint of .*{other}, whose {why}: "
                           f"give --model_dir=.*{other} to use it"):
            load_model(str(tmp_path / "ours"), str(tmp_path / other / "checkpoints" / "ckpt-1"))
    training_dir(tmp_path / "wider", tiny_model_dir, d_model=32, d_ff=64)
    shutil.copytree(tmp_path / "wider" / "checkpoints", tmp_path / "copied")  # no settings
    tensorflow_warnings = logging.handlers.BufferingHandler(10000)
    tf.get_logger().addHandler(tensorflow_warnings)
    try:
        with pytest.raises(ModelDirError) as error:
            load_model(str(tmp_path / "ours"), str(tmp_path / "copied" / "ckpt-1"))
        gc.collect()
    finally:
        tf.get_logger().removeHandler(tensorflow_warnings)
    assert re.search(r"reads back \(ckpt-1: another model's weights: source_embedding/embeddings "
                     r"is \(30, 32\) there, \(30, 64\) in the model .*ours/settings.json "
                     r"describes\)$", str(error.value))
    assert not [r for r in tensorflow_warnings.buffer if "unrestored" in r.getMessage()]
    # A loose copy of a checkpoint that lacks a weight this model has (learned positions).
    shutil.copytree(tmp_path / "ours" / "checkpoints", tmp_path / "sinusoidal")
    with pytest.raises(ModelDirError, match=r"reads back \(ckpt-1: another model's weights: none "
                       r"for positions/position_embeddings, which the model .*layers/"
                       r"settings.json describes has\)$"):
        load_model(str(tmp_path / "layers"), str(tmp_path / "sinusoidal" / "ckpt-1"))


def test_a_vocabulary_replaced_since_training_is_refused(tiny_model_dir, tmp_path):
    # settings.json records the vocabulary's fingerprint: another SentencePiece model of the same
    # size copied over spm.model loaded, and translated and exported wrongly, without a word.
    from tfnmt.data.tokenizer import fingerprint
    from tfnmt.paths import DamagedFileError

    training_dir(tmp_path / "run", tiny_model_dir)
    training_dir(tmp_path / "other", tiny_model_dir, other_vocabulary=True)
    settings = json.loads((tmp_path / "run" / "settings.json").read_text())
    settings["vocab_fingerprint"] = fingerprint((tmp_path / "run" / "spm.model").read_bytes())
    (tmp_path / "run" / "settings.json").write_text(json.dumps(settings))
    assert load_model(str(tmp_path / "run"))[2].endswith("ckpt-1")
    shutil.copy(tmp_path / "other" / "spm.model", tmp_path / "run" / "spm.model")
    with pytest.raises(DamagedFileError, match=r".*run/spm.model: not the vocabulary the model "
                       r"was trained with \(its fingerprint is not the one settings.json "
                       r"records\)"):
        load_model(str(tmp_path / "run"))


def test_auto_passes_over_an_average_older_than_the_run(tmp_path):
    # A run averaged at update 20, then resumed to 40 with --average_last=0: the average is
    # not the model any more. `auto` (export.py, translate.py, evaluate.py, the end-of-run
    # report, --init_from) takes the best, then the latest; "averaged" still names it.
    for directory, numbers in (("checkpoints", (30, 40)), ("averaged", (20,)),
                               ("best", (35,))):
        os.makedirs(tmp_path / directory)
        for n in numbers:
            (tmp_path / directory / f"ckpt-{n}.index").write_bytes(b"")
    names = lambda which: [os.path.relpath(p, tmp_path) for p in
                           candidate_checkpoints(str(tmp_path), which)]
    assert names("auto") == ["best/ckpt-35", "checkpoints/ckpt-40", "checkpoints/ckpt-30"]
    assert names("averaged") == ["averaged/ckpt-20"]
    # Averaged again at the run's last update: that average comes first, the old one not.
    (tmp_path / "averaged" / "ckpt-40.index").write_bytes(b"")
    assert names("auto") == ["averaged/ckpt-40", "best/ckpt-35", "checkpoints/ckpt-40",
                             "checkpoints/ckpt-30"]
    assert names("averaged") == ["averaged/ckpt-40", "averaged/ckpt-20"]


def test_the_best_checkpoint_is_the_one_its_state_names_while_its_files_are_there(tmp_path):
    # best/ holds one checkpoint in use; a run killed between writing a new best and recording
    # it leaves two. The state decides; where its files are gone (removed by hand), the newest
    # there (by number: 12 after 9) stands in, and an empty directory has none.
    best = tmp_path / "best"
    best.mkdir()
    assert best_checkpoint(str(best)) is None
    for n in (5, 9, 12):
        (best / f"ckpt-{n}.index").write_bytes(b"")
    (best / "best.json").write_text(json.dumps({"metric": "bleu", "checkpoint": "ckpt-9"}))
    assert best_checkpoint(str(best)) == str(best / "ckpt-9")
    (best / "ckpt-9.index").unlink()
    assert best_checkpoint(str(best)) == str(best / "ckpt-12")
    (best / "best.json").write_text("{")  # damaged: the files decide
    assert best_checkpoint(str(best)) == str(best / "ckpt-12")


def test_a_checkpoint_named_as_the_log_names_it_is_found_in_the_model_dir(tmp_path,
                                                                         monkeypatch):
    # `--checkpoint=ckpt-40` (train.py logs "ckpt-40 at step 40"): not a path from the
    # working directory, so looked for in checkpoints/, best/ and averaged/, in that order;
    # `best/ckpt-35` (as the error below lists them) in the model_dir.
    model_dir = tmp_path / "run"
    for directory, numbers in (("checkpoints", (30, 40)), ("averaged", (40,)), ("best", (35,))):
        os.makedirs(model_dir / directory)
        for n in numbers:
            (model_dir / directory / f"ckpt-{n}.index").write_bytes(b"")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name, found in (("ckpt-40", "checkpoints/ckpt-40"), ("ckpt-35", "best/ckpt-35"),
                        (str(model_dir / "averaged" / "ckpt-40"), "averaged/ckpt-40"),
                        ("averaged/ckpt-40", "averaged/ckpt-40"),
                        ("checkpoints/ckpt-30", "checkpoints/ckpt-30")):
        assert [os.path.relpath(p, model_dir)
                for p in candidate_checkpoints(str(model_dir), name)] == [found]
    # A directory of checkpoints gives them newest first (as "latest" does its own).
    for directory in (str(model_dir / "checkpoints"), os.path.relpath(model_dir / "best")):
        assert candidate_checkpoints(str(model_dir), directory) == [
            os.path.join(directory, f"ckpt-{n}")
            for n in ((40, 30) if directory.endswith("checkpoints") else (35,))]
    (elsewhere / "ckpt-30.index").write_bytes(b"")  # a path from here comes first
    assert candidate_checkpoints(str(model_dir), "ckpt-30") == ["ckpt-30"]
    with pytest.raises(ModelDirError) as error:
        candidate_checkpoints(str(model_dir), "ckpt-50")
    assert str(error.value) == (f"no checkpoint at ckpt-50; {model_dir} holds checkpoints/ckpt-30, "
                                "checkpoints/ckpt-40, best/ckpt-35, averaged/ckpt-40")
    # A kind the model_dir has none of names those it has; none at all says so.
    shutil.rmtree(model_dir / "averaged")
    with pytest.raises(ModelDirError) as error:
        candidate_checkpoints(str(model_dir), "averaged")
    assert str(error.value) == (f"{model_dir} has no averaged checkpoint; it holds "
                                "checkpoints/ckpt-30, checkpoints/ckpt-40, best/ckpt-35")
    for directory in ("checkpoints", "best"):
        shutil.rmtree(model_dir / directory)
    for which in ("auto", "latest", "best"):
        with pytest.raises(ModelDirError) as error:
            candidate_checkpoints(str(model_dir), which)
        assert str(error.value) == (f"{model_dir} has no checkpoint yet (train.py writes them "
                                    "as it trains, every --checkpoint_every updates)")


def test_an_export_given_as_model_dir_is_named_as_one(tmp_path):
    # A SavedModel version, or an export_dir of numbered versions, where a training directory
    # belongs: the error says which flag reads it. Any other directory gets no such hint.
    version = tmp_path / "export" / "3"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    hint = "; it is a SavedModel export: translate.py and evaluate.py read it with --export"
    for path in (version, version.parent):
        with pytest.raises(ModelDirError) as error:
            load_model(str(path))
        assert str(error.value) == f"{path} holds no trained model (no settings.json){hint}"
    (tmp_path / "other" / "3").mkdir(parents=True)
    for path in (tmp_path / "other", tmp_path / "missing"):
        with pytest.raises(ModelDirError) as error:
            load_model(str(path))
        assert str(error.value) == f"{path} holds no trained model (no settings.json)"
    # A CTranslate2 model where a training directory or an export belongs, and a training
    # directory given as an export.
    ct2 = tmp_path / "ctranslate2"
    ct2.mkdir()
    for name in ("model.bin", "config.json", "spm.model"):
        (ct2 / name).write_bytes(b"")
    ct2_hint = "it is a CTranslate2 model: translate.py and evaluate.py read it with --export"
    with pytest.raises(ModelDirError) as error:
        load_model(str(ct2))
    assert str(error.value) == f"{ct2} holds no trained model (no settings.json); {ct2_hint}"
    training = tmp_path / "run"
    training.mkdir()
    (training / "settings.json").write_text("{}")
    for path, hint in ((ct2, ct2_hint),
                       (training, "it is a training directory: give it as --model_dir")):
        with pytest.raises(FileNotFoundError) as error:
            latest_export(str(path))
        assert str(error.value) == \
            f"{path} holds no SavedModel and no numbered version of one; {hint}"


@pytest.mark.parametrize("settings, what", [
    ({"data": {}}, " holds no model settings: restore it as train.py wrote it, or use another "
     "--model_dir"),
    ({"model": []}, ": its 'model' is a JSON list, not the object of settings train.py writes: "
     "restore it, or use another --model_dir"),
    ({"model": {"vocab_size": 600}, "train": 5}, ": its 'train' is a JSON int, not the object"),
    ({"model": dict(TINY, num_heads=3)}, " holds model settings that build no model (d_model"),
    ({"model": dict(TINY, colour=1)}, " holds model settings that build no model ("),
])
def test_settings_that_describe_no_model_are_refused_in_one_line(tiny_model_dir, tmp_path,
                                                                 settings, what):
    # Edited by hand: every program (load_model: translate, evaluate, export; train.py's
    # resolve_settings) names the file instead of failing in Transformer's arguments.
    from tfnmt.paths import DamagedFileError
    from tfnmt.training.settings import resolve_settings

    model_dir, _ = model_dir_with_checkpoints(tiny_model_dir, tmp_path, [1])
    path = os.path.join(model_dir, "settings.json")
    with open(path, "w") as f:
        json.dump(settings, f)
    with pytest.raises(DamagedFileError) as error:
        load_model(model_dir)
    assert str(error.value).startswith(path + what)
    if "colour" in settings.get("model", {}):
        with pytest.raises(DamagedFileError, match=r"settings.json holds model settings no "
                           r"Transformer takes \(colour\): restore it"):
            resolve_settings({"model": {}, "data": {}, "train": {}}, set(), model_dir)


def test_a_file_system_without_locks_is_used_unlocked_with_a_warning(tmp_path, monkeypatch,
                                                                       caplog):
    # NFS without its lock service (ENOLCK), Lustre mounted without flock (ENOSYS): train.py
    # stopped there with flock's traceback at the checkpoints' lock; it trains, and says what
    # the lock would have refused.
    import errno
    import fcntl

    from tfnmt.checkpoints import DirectoryLock
    from tfnmt.data import data_dir_lock

    def no_locks(file, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    checkpoints, data = str(tmp_path / "run" / "checkpoints"), str(tmp_path / "run" / "data")
    with caplog.at_level(logging.WARNING):
        with DirectoryLock(checkpoints):
            with open(os.path.join(checkpoints, ".lock")) as f:
                assert f.read() == f"pid {os.getpid()}\n"
        with data_dir_lock.preparing(data) as claim:
            claim("it holds other data")
        data_dir_lock.release(data)
    assert caplog.messages == [
        f"{checkpoints}: cannot lock it (No locks available): a second training run in this "
        "model_dir would not be refused",
        f"{data}: cannot lock it (No locks available); runs sharing it must not prepare it at "
        "the same time"]
