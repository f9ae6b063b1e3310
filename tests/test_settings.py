import json
import os

import pytest

from tfnmt.model.presets import get_preset
from tfnmt.training.settings import SettingsError, resolve_settings


def requested(**train):
    model = dict(get_preset("tiny"), max_length=64)
    return {"model_dir": "run", "preset": "tiny", "model": model,
            "data": {"dataset": "files", "files": {"train": "t.tsv"}, "vocab_size": 600,
                     "vocab_type": "unigram", "max_length": 64, "data_dir": None},
            "train": dict({"train_steps": 10, "warmup_steps": 5, "batch_tokens": 512,
                           "eval_every": 4, "mixed_precision": "none"}, **train)}


def saved_run(tmp_path):
    # The presets do not name norm_first, position or attention_dropout: the saved file does
    # not either, and the model was built with the Transformer's defaults for them.
    settings = requested()
    assert not {"norm_first", "position", "attention_dropout"} & set(settings["model"])
    settings["model"]["vocab_size"] = 600
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    return str(tmp_path)


@pytest.mark.parametrize("section, key, value, saved", [
    ("model", "norm_first", True, "False"),  # not in the saved file: the default it was built with
    ("model", "position", "learned", "'sinusoidal'"),
    ("model", "attention_dropout", 0.2, "0.0"),
    ("model", "num_heads", 8, "4"),
    ("train", "warmup_steps", 50, "5"),
    ("train", "batch_tokens", 1024, "512"),
    ("data", "vocab_size", 800, "600"),
    ("train", "mixed_precision", "fp16", "'none'"),  # loss-scale state in the checkpoints
    ("train", "lr_decay", "linear", "'rsqrt'"),  # not in the saved file: it trained on rsqrt
    # Not in the saved file: one shared vocabulary.
    ("data", "separate_vocabularies", True, "False"),
])
def test_a_resumed_run_refuses_other_settings_in_one_line(tmp_path, section, key, value, saved):
    model_dir = saved_run(tmp_path)
    flags = requested()
    flags[section][key] = value
    with pytest.raises(SettingsError) as error:
        resolve_settings(flags, {f"{section}.{key}"}, model_dir)
    assert f"{key}={value!r} (saved: {saved})" in str(error.value)
    assert "\n" not in str(error.value)


def test_settings_meant_to_change_on_resume_change_and_the_rest_are_kept(tmp_path):
    model_dir = saved_run(tmp_path)
    flags = requested(train_steps=99, eval_every=7, warmup_steps=1234, mixed_precision="bf16")
    flags["model"]["num_layers"] = 6
    resolved = resolve_settings(flags, {"train.train_steps", "train.eval_every",
                                        "train.mixed_precision"}, model_dir)
    assert resolved["train"]["train_steps"] == 99 and resolved["train"]["eval_every"] == 7
    assert resolved["train"]["mixed_precision"] == "bf16"
    # Flags not given take the saved values, whatever their defaults are now.
    assert resolved["train"]["warmup_steps"] == 5
    assert resolved["model"]["num_layers"] == get_preset("tiny")["num_layers"]
    assert resolved["model"]["vocab_size"] == 600


def test_a_run_saved_before_lr_decay_existed_resumes_on_rsqrt(tmp_path):
    model_dir = saved_run(tmp_path)
    assert "lr_decay" not in json.load(open(tmp_path / "settings.json"))["train"]
    resolved = resolve_settings(requested(lr_decay="linear"), set(), model_dir)
    assert resolved["train"]["lr_decay"] == "rsqrt"


def test_a_run_saved_before_separate_vocabularies_existed_had_a_shared_one(tmp_path):
    model_dir = saved_run(tmp_path)
    flags = requested()
    flags["data"]["separate_vocabularies"] = False
    resolved = resolve_settings(flags, {"data.separate_vocabularies"}, model_dir)
    assert resolved["data"]["separate_vocabularies"] is False
    flags["data"]["separate_vocabularies"] = True
    (tmp_path / "settings.json").write_text(json.dumps(dict(requested(), data=flags["data"])))
    assert resolve_settings(requested(), set(), model_dir)["data"]["separate_vocabularies"]


def test_checkpoints_without_settings_are_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-3.index").write_bytes(b"")
    with pytest.raises(SettingsError, match="holds checkpoints but no settings.json"):
        resolve_settings(requested(), set(), str(tmp_path))
    assert resolve_settings(requested(), set(), str(tmp_path / "new")) == requested()


def test_a_new_time_budget_for_a_trained_run_is_refused_and_the_same_one_resumes(tmp_path):
    settings = requested(train_minutes=12.0, train_steps=1981)
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    model_dir = str(tmp_path)
    # No checkpoint yet: the new budget replaces the old one.
    assert resolve_settings(requested(train_minutes=60.0), {"train.train_minutes"},
                            model_dir)["train"]["train_minutes"] == 60.0
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-1981.index").write_bytes(b"")
    with pytest.raises(SettingsError) as error:
        resolve_settings(requested(train_minutes=60.0), {"train.train_minutes"}, model_dir)
    assert "train_minutes=60.0 (saved: 12.0, planned as train_steps=1981" in str(error.value)
    assert "\n" not in str(error.value)
    # The same budget again (an interrupted run restarted by its command) resumes it; a number
    # of updates (which sets train_minutes 0) trains it further.
    resumed = resolve_settings(requested(train_minutes=12.0), {"train.train_minutes"}, model_dir)
    assert resumed["train"]["train_steps"] == 1981
    further = resolve_settings(requested(train_minutes=0.0, train_steps=3000),
                               {"train.train_minutes", "train.train_steps"}, model_dir)
    assert further["train"]["train_steps"] == 3000 and further["train"]["train_minutes"] == 0.0


@pytest.mark.parametrize("argv, smoothing", [
    ([], 0.0),  # the main job (cpu preset): no label smoothing
    (["--preset=small"], 0.1), (["--preset=base"], 0.1), (["--preset=big"], 0.1),
    (["--label_smoothing=0.2"], 0.2), (["--preset=base", "--label_smoothing=0"], 0.0)])
def test_label_smoothing_is_the_presets_unless_a_flag_gives_it(argv, smoothing, tmp_path):
    from absl.testing import flagsaver

    from tfnmt.programs import train

    with flagsaver.flagsaver():
        train.FLAGS.unparse_flags()
        train.FLAGS(["train.py", f"--model_dir={tmp_path}", *argv])
        settings, explicit = train.requested_settings()
    assert settings["train"]["label_smoothing"] == smoothing
    assert ("train.label_smoothing" in explicit) == any("label_smoothing" in a for a in argv)


def test_a_resumed_run_takes_its_given_vocabulary_from_another_path(tmp_path):
    # train.py --vocab names files; the run keeps copies of them (spm.model, or
    # source.spm.model and target.spm.model). The same bytes at another path are the same
    # vocabulary; other bytes are another one.
    model_dir = saved_run(tmp_path)
    settings = json.load(open(tmp_path / "settings.json"))
    settings["data"]["vocab"] = ["/gone/spm.model"]
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    (tmp_path / "spm.model").write_bytes(b"model bytes")
    moved, other = tmp_path / "moved.model", tmp_path / "other.model"
    moved.write_bytes(b"model bytes")
    other.write_bytes(b"other bytes")
    flags = requested()
    flags["data"]["vocab"] = [str(moved)]
    assert resolve_settings(flags, {"data.vocab"}, model_dir)["data"]["vocab"] == [str(moved)]
    for given in ([str(other)], [str(tmp_path / "missing.model")], [str(moved)] * 2):
        flags["data"]["vocab"] = given
        with pytest.raises(SettingsError, match=r"vocab=\[.*\] \(saved: \['/gone/spm.model'\]\)"):
            resolve_settings(flags, {"data.vocab"}, model_dir)
    # One model per side: each side's copy.
    settings["data"]["vocab"] = ["/gone/de.model", "/gone/en.model"]
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    (tmp_path / "source.spm.model").write_bytes(b"source bytes")
    (tmp_path / "target.spm.model").write_bytes(b"target bytes")
    (tmp_path / "de.model").write_bytes(b"source bytes")
    (tmp_path / "en.model").write_bytes(b"target bytes")
    flags["data"]["vocab"] = [str(tmp_path / "de.model"), str(tmp_path / "en.model")]
    assert resolve_settings(flags, {"data.vocab"}, model_dir)["data"]["vocab"] == \
        flags["data"]["vocab"]
    flags["data"]["vocab"].reverse()
    with pytest.raises(SettingsError, match="vocab="):
        resolve_settings(flags, {"data.vocab"}, model_dir)


def test_a_resumed_run_given_its_preset_keeps_its_max_length(tmp_path):
    # --max_length is a flag of its own, which no preset sets: a resumed run given --preset
    # again without it keeps the saved one (it was refused as "max_length=256 (saved: 64)"),
    # and one given another --max_length is refused.
    from absl.testing import flagsaver

    from tfnmt.programs import train

    model_dir = saved_run(tmp_path)
    for argv, kept in ((["--preset=tiny"], 64), (["--preset=tiny", "--max_length=64"], 64),
                       (["--preset=tiny", "--max_length=128"], None)):
        with flagsaver.flagsaver():
            train.FLAGS.unparse_flags()
            train.FLAGS(["train.py", f"--model_dir={model_dir}", *argv])
            requested_now, explicit = train.requested_settings()
        if kept is None:
            with pytest.raises(SettingsError, match=r"^\S+ holds a run with other settings: "
                               r"max_length=128 \(saved: 64\)\. "):
                resolve_settings(requested_now, explicit, model_dir)
        else:
            resolved = resolve_settings(requested_now, explicit, model_dir)
            assert resolved["model"]["max_length"] == kept


def test_a_resumed_run_takes_its_corpus_from_another_path(tmp_path, small_corpus):
    # The corpus files moved since the run prepared its data: given at their new paths, the
    # same bytes (the sha256 the prepared data's manifest recorded) resume the run; other
    # bytes, or another layout, are another corpus.
    import shutil

    from tfnmt.data import records

    model_dir = saved_run(tmp_path)
    first = {"train": str(tmp_path / "train.tsv"), "dev": str(tmp_path / "dev.tsv")}
    for split, path in first.items():
        shutil.copy(small_corpus[split], path)
    records.prepare(str(tmp_path / "data"), dataset="files", files=first, vocab_size=600,
                    train_shards=1)
    settings = json.load(open(tmp_path / "settings.json"))
    settings["data"]["files"] = first
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    (tmp_path / "moved").mkdir()
    moved = {split: str(tmp_path / "moved" / f"{split}.tsv") for split in first}
    for split in first:
        os.rename(first[split], moved[split])
    flags = requested()
    flags["data"]["files"] = moved
    assert resolve_settings(flags, {"data.files"}, model_dir)["data"]["files"] == moved
    with open(moved["dev"], "a") as f:
        f.write("Noch ein Satz.\tOne more sentence.\n")
    for given in (moved, dict(moved, test=moved["dev"]), {"train": [moved["train"]] * 2,
                                                           "dev": moved["dev"]}):
        flags["data"]["files"] = given
        with pytest.raises(SettingsError, match=r"files=\{.*\} \(saved: \{"):
            resolve_settings(flags, {"data.files"}, model_dir)


def test_a_resumed_run_given_some_of_its_files_keeps_the_others(tmp_path):
    # "Flags left out keep their saved values" holds for each split's files: a run trained with
    # --train_files, --dev_files and --test_files resumes given only some of them (it was
    # refused, the files of a split left out counting as removed); other files are refused.
    from absl.testing import flagsaver

    from tfnmt.programs import train

    model_dir = saved_run(tmp_path)
    settings = json.load(open(tmp_path / "settings.json"))
    files = {"train": "t.tsv", "dev": "d.tsv", "test": "e.tsv"}
    settings["data"]["files"] = files
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    for argv, refused in ((["--train_files=t.tsv", "--dev_files=d.tsv"], None),
                          (["--dev_files=d.tsv"], None),
                          (["--test_files=e.tsv", "--train_files=t.tsv"], None),
                          (["--train_files=t.tsv", "--test_files=other.tsv"], "other.tsv")):
        with flagsaver.flagsaver():
            train.FLAGS.unparse_flags()
            train.FLAGS(["train.py", f"--model_dir={model_dir}", *argv])
            requested_now, explicit = train.requested_settings()
        if refused:
            with pytest.raises(SettingsError, match=rf"^\S+ holds a run with other settings: "
                               rf"files=.*'test': '{refused}'.* \(saved: "):
                resolve_settings(requested_now, explicit, model_dir)
        else:
            assert resolve_settings(requested_now, explicit, model_dir)["data"]["files"] == files
