"""Faults a model_dir must survive: each is injected into a tiny train.py run (in a subprocess
where a kill, a full disk or the command line itself is the point), and the run either recovers
from the newest checkpoint that reads back or stops with one line naming what is wrong."""
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import ROOT, built_once, imported_modules, python, started, train_flags
from tfnmt.checkpoints import (DirectoryLock, checkpoint_prefixes, load_model,
                               newest_readable_checkpoint)
from tfnmt.data import records
from tfnmt.paths import VOCAB, DamagedFileError, made_directory, read_settings
from tfnmt.training.stop_signals import StopSignals

FAST = dict(log_every=2, checkpoint_every=2, eval_every=0, bleu_sentences=2, average_last=0,
            keep_checkpoints=3)


def last_line(result):
    return result.stderr.strip().splitlines()[-1]


def checkpoint_numbers(model_dir):
    return [int(p.rsplit("-", 1)[1])
            for p in checkpoint_prefixes(os.path.join(model_dir, "checkpoints"))]


def flip_bytes(path, count=64):
    """Inverts `count` bytes in the middle of the file (its size stays the same)."""
    with open(path, "r+b") as f:
        middle = os.path.getsize(path) // 2
        f.seek(middle)
        data = bytes(255 - b for b in f.read(count))
        f.seek(middle)
        f.write(data)


@pytest.fixture(scope="session")
def trained(small_corpus, train_data, tmp_path_factory):
    """A model_dir after 6 steps (ckpt-2, 4, 6) with its prepared data inside, as
    `python train.py` leaves one; tests damage copies of it. Trained once for all pytest-xdist
    workers (the first takes the lock and trains; the others wait for it)."""
    def build(model_dir):
        # Records prepared by the same settings: train.py finds them up to date.
        shutil.copytree(train_data, os.path.join(model_dir, "data"))
        result = python(*train_flags(small_corpus, None, model_dir, train_steps=6, **FAST))
        assert result.returncode == 0, result.stderr[-3000:]
        with open(os.path.join(os.path.dirname(model_dir), "corpus.json"), "w") as f:
            json.dump(small_corpus, f)  # the builder's corpus paths, for `corpus`

    model_dir = built_once(tmp_path_factory, "faults_trained", build)
    assert checkpoint_numbers(model_dir) == [2, 4, 6]
    return model_dir


@pytest.fixture
def corpus(trained):
    """The text files `trained` was trained on (another worker's copy of the small corpus:
    the same bytes under other paths would count as other data and rebuild it)."""
    with open(os.path.join(os.path.dirname(trained), "corpus.json")) as f:
        return json.load(f)


@pytest.fixture
def copied(trained, tmp_path):
    """A `cp -r` of the trained model_dir, somewhere else."""
    copy = str(tmp_path / "copied")
    shutil.copytree(trained, copy)
    os.remove(os.path.join(copy, "checkpoints", ".lock"))
    return copy


def test_damaged_state_file_shard_and_interrupted_save_are_recovered(corpus, copied):
    # Faults at once, each with its own recovery: a state file that is not text, a train shard
    # with 64 flipped bytes (same size) in a copied model_dir, the folder an interrupted
    # checkpoint save leaves, and a truncated copy of the vocabulary in the model_dir (the run
    # recognises the data's vocabulary by the fingerprint in settings.json and copies it back).
    checkpoints = os.path.join(copied, "checkpoints")
    with open(os.path.join(checkpoints, "checkpoint"), "wb") as f:
        f.write(b"\xff")
    shard = records.shard_paths(os.path.join(copied, "data"),
                                records.load_manifest(os.path.join(copied, "data")), "train")[1]
    flip_bytes(shard)
    os.makedirs(os.path.join(checkpoints, "ckpt-7_temp"))
    open(os.path.join(checkpoints, "ckpt-7_temp", "part-00000-of-00001.index"), "wb").close()
    vocab = os.path.join(copied, VOCAB)
    with open(vocab, "r+b") as f:  # the model's vocabulary copy, cut off mid-write
        f.truncate(1000)

    result = python(*train_flags(corpus, None, copied, train_steps=8, **FAST))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"{checkpoints}/checkpoint was unreadable (UnicodeDecodeError); rebuilt from the 3 "
            "checkpoint file(s) there (newest ckpt-6)") in result.stderr
    assert (f"{shard} is damaged (its checksum differs from the manifest's); rewriting the "
            "train split with the same vocabulary") in result.stderr
    assert f"removed {checkpoints}/ckpt-7_temp, left by an interrupted save" in result.stderr
    assert f"resumed from {checkpoints}/ckpt-6 at step 6" in result.stdout
    # Only the oldest checkpoint was rotated out (keep 3), never one newer than the restored.
    assert checkpoint_numbers(copied) == [4, 6, 8]
    assert not records.damaged_shards(os.path.join(copied, "data"),
                                      records.load_manifest(os.path.join(copied, "data")))
    with open(vocab, "rb") as ours, open(os.path.join(copied, "data", VOCAB), "rb") as data:
        assert ours.read() == data.read()


def test_a_shard_damaged_during_training_is_named(corpus, copied):
    # Damage after the start-of-run checksums (records.prepare) passed: the read error
    # TensorFlow raises names no file; the one line must.
    flags = train_flags(corpus, None, copied, train_steps=10, **FAST)
    script = ("import runpy, sys, tfnmt.data.records as records\n"
              "prepare = records.prepare\n"
              "def prepare_then_damage(out_dir, *args, **kwargs):\n"
              "    manifest = prepare(out_dir, *args, **kwargs)\n"
              f"    sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"
              "    from test_faults import flip_bytes\n"
              "    for path in records.shard_paths(out_dir, manifest, 'train'):\n"
              "        flip_bytes(path)\n"
              "    return manifest\n"
              "records.prepare = prepare_then_damage\n"
              f"sys.argv = {flags!r}\n"
              "runpy.run_path('train.py', run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 1
    assert re.fullmatch(
        rf"train\.py: {re.escape(copied)}/data/train-\d+-of-\d+\.tfrecord is damaged \(its "
        rf"checksum differs from the manifest's\); stopped: the newest intact checkpoint is "
        rf"{re.escape(copied)}/checkpoints/ckpt-6 \(run again to resume from it: the damaged "
        r"split is rewritten\)", last_line(result)), last_line(result)
    assert "Traceback" not in result.stderr


def test_changed_settings_are_refused_and_leave_the_model_dir_usable(corpus, copied):
    settings = open(os.path.join(copied, "settings.json"), "rb").read()
    result = python(*train_flags(corpus, None, copied, train_steps=8, norm_first=True,
                                 attention_dropout=0.2, **FAST),
                    env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 1
    assert last_line(result) == (
        f"train.py: {copied} holds a run with other settings: attention_dropout=0.2 (saved: "
        "0.0), norm_first=True (saved: False). Use a new --model_dir, or drop these flags to "
        "continue the saved run.")
    assert "tensorflow" not in imported_modules(result.stderr)  # refused before it loads
    # One file flag given on its own is compared with the saved files (it was taken for a new
    # run's and refused as "--dataset=files needs --train_files").
    result = python("train.py", f"--model_dir={copied}", f"--test_files={corpus['dev']}")
    assert result.returncode == 1
    assert last_line(result).startswith(f"train.py: {copied} holds a run with other settings: "
                                        "files={"), last_line(result)
    assert f"'test': '{corpus['dev']}'" in last_line(result)
    assert last_line(result).endswith(
        "to continue the saved run. To score the trained model on a test set: python "
        f"evaluate.py --model_dir={copied} with its sources as --source and references as "
        "--reference")
    sides = [os.path.join(os.path.dirname(copied), name) for name in ("t.de", "t.en")]
    for side in sides:
        with open(side, "w", encoding="utf-8") as f:
            f.write("Ein Haus.\n" if side.endswith("de") else "A house.\n")
    result = python("train.py", f"--model_dir={copied}", f"--test_files={','.join(sides)}")
    assert last_line(result).endswith(f"python evaluate.py --model_dir={copied} "
                                      f"--source={sides[0]} --reference={sides[1]}")
    result = python("train.py", f"--model_dir={copied}", f"--test_files={','.join(sides)}",
                    f"--dev_files={','.join(sides)}")  # more than the test files: no hint
    assert last_line(result).endswith("drop these flags to continue the saved run.")
    assert open(os.path.join(copied, "settings.json"), "rb").read() == settings
    assert load_model(copied)[2].endswith("ckpt-6")

    os.remove(os.path.join(copied, "settings.json"))
    result = python(*train_flags(corpus, None, copied, train_steps=8, num_heads=8, **FAST))
    assert result.returncode == 1
    assert last_line(result) == (
        f"train.py: {copied} holds checkpoints but no settings.json: nothing says which model "
        "they hold. Restore the file or use a new --model_dir.")


def test_a_second_run_in_the_same_model_dir_is_refused(corpus, copied):
    with DirectoryLock(os.path.join(copied, "checkpoints")):
        result = python(*train_flags(corpus, None, copied, train_steps=8, **FAST))
    assert result.returncode == 1
    assert last_line(result) == (f"train.py: {copied}/checkpoints is in use by pid "
                                 f"{os.getpid()} (one training run per model_dir)")
    assert checkpoint_numbers(copied) == [2, 4, 6]


def test_export_uses_the_newest_checkpoint_that_reads_back(copied, caplog):
    # What export.py, translate.py and evaluate.py load (tests/test_checkpoints.py: each case).
    checkpoints = os.path.join(copied, "checkpoints")
    with open(os.path.join(checkpoints, "ckpt-6.data-00000-of-00001"), "r+b") as f:
        f.truncate(100)
    os.remove(os.path.join(checkpoints, "ckpt-4.index"))
    with caplog.at_level(logging.WARNING):
        model, _, path = load_model(copied, "latest")
    assert path == os.path.join(checkpoints, "ckpt-2")
    assert f"using {path}: newer checkpoints do not read back (ckpt-6: " in caplog.text
    # What a training run's fault messages and --init_from name: ckpt-6's index reads, its
    # values do not.
    assert newest_readable_checkpoint(checkpoints) == path
    expected, _, _ = load_model(copied, path)
    for ours, theirs in zip(model.trainable_variables, expected.trainable_variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_full_disk_stops_with_one_line(small_corpus, train_data, tmp_path):
    # A 6 MiB file system (tmpfs in a private mount namespace): room for two checkpoints of
    # the preset's two layers.
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    model_dir = str(mount_point / "run")
    flags = train_flags(small_corpus, train_data, model_dir, train_steps=12, num_layers=None,
                        **FAST)
    command = (f"mount -t tmpfs -o size=6m none {mount_point} && exec {sys.executable} "
               + " ".join(f"'{a}'" for a in [os.path.join(ROOT, flags[0])] + flags[1:]))
    result = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", command],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 1, result.stderr[-3000:]
    match = re.fullmatch(
        rf"train\.py: no space left on the device to write {re.escape(model_dir)}/checkpoints/"
        rf"ckpt-(\d+)_temp/part-00000-of-00001\.data-00000-of-00001; the newest intact "
        rf"checkpoint is {re.escape(model_dir)}/checkpoints/ckpt-(\d+) \(free space and run "
        r"again to resume from it\)", last_line(result))
    assert match, last_line(result)
    failed, newest = int(match.group(1)), int(match.group(2))
    assert newest >= 2 and failed == newest + 2
    assert "Traceback" not in result.stderr
    assert f"step {failed:6d}/12" in result.stdout  # it stopped at the failed save


def on_a_small_disk(mount_point, size, command):
    """`command` (a list) run with a tmpfs of `size` mounted at `mount_point` (made here) in a
    private mount namespace; its stdout ends with what the disk holds then (`find`, a path a
    line)."""
    mount_point.mkdir()
    return subprocess.run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c",
         f"mount -t tmpfs -o size={size} none {shlex.quote(str(mount_point))} && "
         f"{shlex.join(command)}; status=$?; find {shlex.quote(str(mount_point))} -mindepth 1; "
         "exit $status"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


@pytest.mark.parametrize("size, written, kept", [
    # The learned SentencePiece model (~250 KB) does not fit: SentencePiece's own write left
    # a truncated model without an error, and reading it back failed with protobuf's
    # DecodeError traceback.
    ("200k", "data/.learned.spm.model", []),
    # It fits once: the shared model was written twice (source and target), and the second
    # copy failed, leaving spm.model.tmp behind; now the shards are what does not fit.
    ("250k", "data/train-", ["spm.model"]),
])
def test_a_full_disk_while_the_data_is_prepared_stops_with_one_line(size, written, kept,
                                                                      small_corpus, tmp_path):
    mount_point = tmp_path / "small_disk"
    model_dir = str(mount_point / "run")
    flags = train_flags(small_corpus, None, model_dir, train_steps=4, **FAST)
    result = on_a_small_disk(mount_point, size,
                             [sys.executable, os.path.join(ROOT, flags[0]), *flags[1:]])
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.fullmatch(
        rf"train\.py: no space left on the device to write {re.escape(model_dir)}/"
        rf"{re.escape(written)}\S*; no checkpoint has been written yet \(free space and run "
        r"again\)", last_line(result)), result.stderr[-3000:]
    left = sorted(os.path.relpath(line, model_dir) for line in result.stdout.splitlines()
                  if line.startswith(model_dir + "/"))
    assert left == sorted(["checkpoints", "checkpoints/.lock", "data", "data/.in_use.lock",
                           "data/.prepare.lock", *(f"data/{name}" for name in kept)]), left


def test_the_embedded_corpus_is_read_in_a_read_only_home(tmp_path):
    # A container's read-only home: TFDS's default directory (~/tensorflow_datasets) cannot be
    # written, and `python train.py` stopped with a traceback (OSError: Read-only file system)
    # preparing the embedded corpus there; its TFDS builder (which `tfds.load` reads; tfnmt
    # reads the files) is prepared in the temporary directory instead.
    import gzip

    from tfnmt.paths import EMBEDDED_DIR

    home, temporary = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temporary.mkdir()
    code = ("from tfnmt.data import corpus; "
            "print(sum(1 for _ in corpus.read_tfds(corpus.EMBEDDED_TFDS_NAME, 'dev')))")
    env = {k: v for k, v in os.environ.items() if k != "TFDS_DATA_DIR"}
    result = subprocess.run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c",
         f"mount -t tmpfs -o ro,size=64k none {shlex.quote(str(home))} && "
         f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(env, HOME=str(home), TMPDIR=str(temporary), TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    with gzip.open(os.path.join(EMBEDDED_DIR, "dev.tsv.gz"), "rt", encoding="utf-8") as f:
        assert int(result.stdout.split()[-1]) == sum(1 for _ in f)
    built = list(temporary.glob("tfnmt-tensorflow_datasets-*"))
    assert len(built) == 1 and "tfnmt_de_en" in os.listdir(built[0])


@pytest.mark.parametrize("export_format", ["saved_model", "ctranslate2"])
def test_an_export_to_a_full_disk_publishes_nothing_and_says_so(export_format, tiny_model_dir,
                                                                tmp_path):
    # A 256 KiB file system (tmpfs in a private mount namespace): the export does not fit.
    mount_point = tmp_path / "small_disk"
    export_dir = mount_point / "exports" / "de-en"  # neither directory exists yet
    command = [sys.executable, os.path.join(ROOT, "export.py"), f"--model_dir={tiny_model_dir}",
               f"--export_dir={export_dir}", f"--format={export_format}"]
    result = on_a_small_disk(mount_point, "256k", command)
    assert result.returncode == 1, result.stderr[-3000:]
    assert last_line(result) == (f"export.py: nothing published: no space left on the device "
                                 f"to write {export_dir} (free space and export again)")
    assert "Traceback" not in result.stderr
    # Nothing left on the disk: no version, no temporary directory, none of the directories
    # the export made.
    left = [line for line in result.stdout.splitlines() if line.startswith(str(mount_point))]
    assert left == [], result.stdout


def test_a_test_file_gone_bad_during_training_costs_only_the_test_report(small_corpus,
                                                                        tmp_path):
    # The test split is read at the end of the run: a file that cannot be read by then (here
    # a directory in its place) leaves the run trained and evaluated on dev, with a line saying
    # why; the same command, once the file is back, makes the report.
    test_tsv = tmp_path / "test.tsv"
    test_tsv.write_text("".join(open(small_corpus["dev"], encoding="utf-8").readlines()[:8]),
                        encoding="utf-8")
    model_dir = tmp_path / "run"
    flags = train_flags(small_corpus, None, str(model_dir), test_files=str(test_tsv),
                        train_steps=8, eval_every=0, average_last=0)
    process = started(*flags)
    try:
        for line in process.stdout:
            if line.startswith("starting from scratch"):
                test_tsv.unlink()
                test_tsv.mkdir()
                break
        out, err = process.communicate(timeout=240)
    finally:
        process.kill()
    assert process.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    assert (f"no test report: {test_tsv}: Is a directory; run the same command again for it"
            in out.splitlines())
    report = json.load(open(model_dir / "report.json"))
    assert report["dev_greedy"]["bleu"] is not None and report["test"] is None
    test_tsv.rmdir()
    test_tsv.write_text("".join(open(small_corpus["dev"], encoding="utf-8").readlines()[:8]),
                        encoding="utf-8")
    again = python(*flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "\ntest (8 sentences, beam 4, length penalty 0.6, " in again.stdout, again.stdout
    assert json.load(open(model_dir / "report.json"))["test"]["sentences"] == 8


def test_directories_made_for_a_failed_write_are_removed_when_left_empty(tmp_path):
    def fail_in(directory, write=None):
        with pytest.raises(OSError, match="the write failed"):
            with made_directory(directory):
                assert os.path.isdir(directory)
                if write:
                    (write / "other").write_text("written meanwhile")
                raise OSError("the write failed")

    fail_in(tmp_path / "a" / "b" / "c")  # all three made, all three removed
    assert os.listdir(tmp_path) == []
    (tmp_path / "kept").mkdir()
    fail_in(tmp_path / "kept" / "new")  # only what it made
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []
    fail_in(tmp_path / "x" / "y", write=tmp_path / "x")  # x holds a file: y goes, x stays
    assert os.listdir(tmp_path / "x") == ["other"]
    with made_directory(tmp_path / "ok" / "dir"):  # a block that succeeds keeps them
        pass
    assert os.path.isdir(tmp_path / "ok" / "dir")


@pytest.mark.parametrize("fault, expected", [
    ("directory", "--train_files: {dir} is a directory, not a file"),
    ("empty", "--train_files: {dir}/empty.tsv is empty"),
    ("unaligned", "--train_files: {dir}/src.txt has 3 lines but {dir}/tgt.txt has 2: the files "
                  "are not line-aligned"),
    ("model_dir_file", "--model_dir={dir}/file is a file, not a directory"),
    ("model_dir_empty", "--model_dir must name a directory"),
])
def test_bad_paths_fail_in_one_line_before_any_work(fault, expected, small_corpus, tmp_path):
    directory = str(tmp_path)
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "src.txt").write_text("a\nb\nc\n")
    (tmp_path / "tgt.txt").write_text("x\ny\n")
    (tmp_path / "file").write_text("not a directory")
    train_files = {"directory": directory, "empty": f"{directory}/empty.tsv",
                   "unaligned": f"{directory}/src.txt,{directory}/tgt.txt"}
    flags = train_flags(small_corpus, None, str(tmp_path / "run"),
                        train_files=train_files.get(fault, small_corpus["train"]))
    if fault == "model_dir_file":
        flags[1] = f"--model_dir={directory}/file"
    if fault == "model_dir_empty":
        flags[1] = "--model_dir="
    result = python(*flags, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == "train.py: " + expected.format(dir=directory)
    assert not os.path.exists(tmp_path / "run")


def test_directories_it_cannot_write_in_fail_in_one_line(small_corpus, tmp_path):
    # A directory no one can create files in (sysfs; for root too) as the model_dir, or as a
    # data_dir that must be prepared (a prepared one is read where it cannot be written): a new
    # run, and a resumed one on a read-only mount, ended in a traceback from the lock of its
    # checkpoints, or from SentencePiece's trainer.
    cannot = r"\((Permission denied|Read-only file system)\)"
    result = python(*train_flags(small_corpus, None, "/sys"), timeout=60)
    assert result.returncode == 1
    assert re.fullmatch(rf"train\.py: --model_dir=/sys: cannot write in it {cannot}: train\.py "
                        r"keeps its settings, checkpoints and summaries there",
                        result.stderr.strip()), result.stderr[-2000:]
    result = python(*train_flags(small_corpus, "/sys", str(tmp_path / "run")), timeout=120)
    assert result.returncode == 1
    assert re.fullmatch(rf"train\.py: /sys: the data must be prepared there, and no file can be "
                        rf"written in it {cannot}: give a --data_dir that can be written in",
                        last_line(result)), result.stderr[-2000:]


def test_export_to_a_file_or_over_an_existing_export_fails_in_one_line(tiny_model_dir, tmp_path):
    # Refused before TensorFlow loads (and the model with it); nothing is written. An export_dir
    # that cannot be written in was found only after building the model (30 s for the main
    # job's).
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "export" / "3").mkdir(parents=True)
    linked = tmp_path / "linked"  # the model, with a file where its exports would go
    linked.mkdir()
    for name in os.listdir(tiny_model_dir):
        if name != "export":
            os.symlink(os.path.join(tiny_model_dir, name), linked / name)
    (linked / "export").write_text("not a directory")
    for flags, message in (([f"--export_dir={tmp_path}/file"],
                            f"--export_dir={tmp_path}/file is a file, not a directory"),
                           ([f"--model_dir={linked}"],
                            f"{linked}/export is a file, not a directory: give --export_dir"),
                           ([f"--export_dir={tmp_path}/export", "--version=3"],
                            f"{tmp_path}/export/3 exists; versions are never overwritten"),
                           ([f"--export_dir={tmp_path}/export", "--format=ctranslate2"],
                            f"{tmp_path}/export exists; give another --export_dir or remove it")):
        result = python("export.py", f"--model_dir={tiny_model_dir}", *flags,
                        env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=120)
        assert result.returncode == 1
        assert last_line(result) == f"export.py: {message}"
        assert "tensorflow" not in imported_modules(result.stderr)
    for export_format in ("saved_model", "ctranslate2"):  # no file can be made in sysfs
        result = python("export.py", f"--model_dir={tiny_model_dir}", "--export_dir=/sys/exp",
                        f"--format={export_format}", env={"PYTHONPROFILEIMPORTTIME": "1"},
                        timeout=120)
        assert result.returncode == 1
        assert re.fullmatch(r"export\.py: /sys/exp: cannot write in it \((Permission denied|"
                            r"Read-only file system)\)", last_line(result)), last_line(result)
        assert "tensorflow" not in imported_modules(result.stderr)
    assert (tmp_path / "file").read_text() == (linked / "export").read_text() == "not a directory"
    assert [p.name for p in (tmp_path / "export").iterdir()] == ["3"]
    assert not list((tmp_path / "export" / "3").iterdir())


def kill_at_a_random_moment(process, rng):
    """SIGKILLs a train.py run at a random moment of its work, found from its own log (so the
    moments are alike on fast and slow CPUs): up to 1.5 s after one of its first eight lines,
    chosen at random. Each line starts a phase: data preparation, the model's building and
    restoring, tracing the step, and updates with a checkpoint written after each logged one.

    Returns:
      The stdout lines read.
    """
    lines = []
    for _ in range(rng.randint(1, 8)):
        line = process.stdout.readline()
        if not line:  # ended by itself
            return "".join(lines)
        lines.append(line)
    try:
        process.wait(timeout=rng.uniform(0.0, 1.5))
    except subprocess.TimeoutExpired:
        process.kill()
    return "".join(lines)


def test_killed_three_times_then_a_damaged_manifest_and_the_run_finishes(small_corpus, tmp_path):
    # kill -9 at random moments of a run that prepares its own data (vocabulary, shards,
    # tracing, steps and checkpoint writes can all be hit); each rerun resumes from the newest
    # checkpoint that reads back. Before the last run the data's manifest is cut off mid-write:
    # that run rebuilds the data (with the model's vocabulary once a model exists) and finishes.
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    model_dir = str(tmp_path / "run")
    data_dir = os.path.join(model_dir, "data")
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for attempt in range(4):
        newest = newest_readable_checkpoint(os.path.join(model_dir, "checkpoints"))
        # The killed runs aim far beyond where a kill can find them; the last one goes 8 steps
        # past the newest checkpoint (--train_steps may change on resume).
        last_step = 1000
        if attempt == 3:
            os.makedirs(data_dir, exist_ok=True)
            with open(os.path.join(data_dir, records.MANIFEST), "w") as f:
                f.write('{"settings": {"format": 2,')
            has_model = os.path.exists(os.path.join(model_dir, "settings.json"))
            last_step = (int(newest.rsplit("-", 1)[1]) if newest else 0) + 8
        flags = train_flags(small_corpus, None, model_dir, train_steps=last_step, **FAST)
        command = [sys.executable, os.path.join(ROOT, flags[0]), *flags[1:]]
        process = subprocess.Popen(command, cwd=ROOT, env=environment, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        logged = kill_at_a_random_moment(process, rng) if attempt < 3 else ""
        out, err = process.communicate(timeout=300)
        out = logged + out
        started = "starting from scratch" if newest is None else f"resumed from {newest} at"
        if attempt == 3 or "resumed from" in out or "starting from scratch" in out:
            assert started in out, f"seed {seed}, attempt {attempt}: {out}{err[-2000:]}"
    assert process.returncode == 0, f"seed {seed}: {err[-3000:]}"
    assert f"step {last_step:6d}/{last_step}" in out
    assert checkpoint_numbers(model_dir)[-1] == last_step
    assert not [n for n in os.listdir(os.path.join(model_dir, "checkpoints")) if "_temp" in n]
    assert (f"rebuilding {data_dir}: {data_dir}/{records.MANIFEST} is damaged (JSONDecodeError"
            in err)
    if has_model:  # not learned again: it could differ, and no longer fit the model
        assert f"{data_dir}: tokenizing with the model's vocabulary {model_dir}/spm.model" in err


def test_a_closed_terminal_saves_the_update_training_stopped_after(small_corpus, train_data,
                                                                  tmp_path):
    # A closed terminal's SIGHUP (an ssh connection lost) ends the update under way, saves it
    # and exits 129, as a shell reports a process SIGHUP ended (it died at once, its updates
    # since the last checkpoint lost): with checkpoints every 1,000 updates, the interrupted
    # run's only checkpoint is the one the signal made. Ctrl-C's SIGINT takes the same path
    # (the time-budget test in test_training), as SIGTERM does (stop_signals.SIGNALS).
    model_dir = str(tmp_path / "run")
    flags = train_flags(small_corpus, train_data, model_dir, train_steps=100000, log_every=3,
                        checkpoint_every=1000, eval_every=0, average_last=0, test_report="false")
    process = started(*flags)
    try:
        for line in process.stdout:  # the loop is running once it logs
            if line.startswith("step "):
                break
        process.send_signal(signal.SIGHUP)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 129, err[-3000:]
    checkpoints = os.path.join(model_dir, "checkpoints")
    stopped = re.fullmatch(rf"stopped by SIGHUP after step (\d+), saved in "
                           rf"{re.escape(checkpoints)}/ckpt-(\d+); run the same command to "
                           r"resume", out.strip().splitlines()[-1])
    assert stopped and stopped[1] == stopped[2] and int(stopped[1]) >= 3, out[-2000:]
    step = int(stopped[1])
    assert checkpoint_numbers(model_dir) == [step] and "Traceback" not in err
    reader = tf.train.load_checkpoint(os.path.join(checkpoints, f"ckpt-{step}"))
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == step


def test_stop_signals_record_the_first_signal_and_pass_on_the_second():
    # SIGUSR1/SIGUSR2 stand in for SIGINT/SIGTERM, whose handlers belong to the test runner.
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    ignored = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        with StopSignals((signal.SIGUSR1, signal.SIGUSR2)) as stop:
            os.kill(os.getpid(), signal.SIGUSR2)  # ignored by the process: stays ignored
            assert stop.received is None
            os.kill(os.getpid(), signal.SIGUSR1)
            assert stop.received == signal.SIGUSR1 and calls == []
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler from before gets the second
            assert calls == [signal.SIGUSR1] and stop.received == signal.SIGUSR1
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)
        assert calls == [signal.SIGUSR1] * 2
    finally:
        signal.signal(signal.SIGUSR1, previous)
        signal.signal(signal.SIGUSR2, ignored)


def test_a_damaged_settings_file_or_vocabulary_is_named_in_one_line(tiny_model_dir, tmp_path):
    # Cut short or edited into something else, settings.json and spm.model are refused where
    # they are read, naming the file (not a JSON or protobuf traceback from deep inside).
    model_dir = tmp_path / "run"
    shutil.copytree(tiny_model_dir, model_dir)
    settings_path, spm_path = model_dir / "settings.json", model_dir / VOCAB
    settings, spm = settings_path.read_text(), spm_path.read_bytes()
    settings_path.write_text(settings[:40])
    with pytest.raises(DamagedFileError, match=re.escape(f"{settings_path} does not read as "
                                                         "JSON (")):
        load_model(str(model_dir))
    settings_path.write_text("[1, 2]")
    with pytest.raises(DamagedFileError, match="holds a JSON list, not the object"):
        read_settings(str(model_dir))
    settings_path.write_text(settings)
    for damaged, reason in ((spm[:1000], r"\(Error parsing message"),
                            (b"", r"\(it holds no pieces\)")):
        spm_path.write_bytes(damaged)
        with pytest.raises(DamagedFileError,
                           match=re.escape(f"{spm_path} is not a SentencePiece model ") + reason):
            load_model(str(model_dir))
    # A program prints it as one line and exits 1 (evaluate.py reads settings.json before it
    # loads TensorFlow).
    settings_path.write_text(settings[:40])
    result = python("evaluate.py", f"--model_dir={model_dir}", timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert re.fullmatch(re.escape(f"evaluate.py: {settings_path} does not read as JSON (") + r".+"
                        + re.escape("): restore it as train.py wrote it, or use another "
                                    "--model_dir"), result.stderr.strip().splitlines()[-1])

