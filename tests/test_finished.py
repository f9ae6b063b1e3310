"""A finished run's report is reused only while everything its end read is unchanged
(tfnmt/training/finished.py); test_training.py's end-to-end run starts a finished run again."""
import json
import os
import shutil

import pytest

from tfnmt.training.finished import end_record, reported_end


@pytest.fixture
def ended(tmp_path):
    """A model_dir whose run ended at step 8: checkpoints 4 and 8, the average of both (what
    the test report translated), and report.json with the end's record."""
    model_dir = tmp_path / "run"
    for name in ("checkpoints/ckpt-4", "checkpoints/ckpt-8", "averaged/ckpt-8"):
        (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / f"{name}.index").write_bytes(b"")
    files = {}
    for split in ("train", "dev", "test"):
        files[split] = str(tmp_path / f"{split}.tsv")
        (tmp_path / f"{split}.tsv").write_text(f"ein {split}\tan {split}\n", encoding="utf-8")
    settings = {"model_dir": str(model_dir), "model": {"d_model": 64},
                "data": {"dataset": "files", "files": files, "max_length": 64},
                "train": {"train_steps": 8, "average_last": 2}}
    report = {"dev_greedy": {"bleu": 1.5}, "end": end_record(settings, "auto", True),
              "test": {"checkpoint": os.path.join("averaged", "ckpt-8"), "bleu": 2.5}}
    (model_dir / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return model_dir, settings, report


def test_the_same_end_is_reported_again(ended):
    model_dir, settings, report = ended
    assert reported_end(str(model_dir), end_record(settings, "auto", True)) == report
    # The vocabulary's fingerprint, which the run adds to its settings, is not part of it.
    with_vocab = dict(settings, vocab_fingerprint="abc")
    assert reported_end(str(model_dir), end_record(with_vocab, "auto", True)) == report
    # Nor is the training text: the checkpoints were trained on it.
    with open(settings["data"]["files"]["train"], "a", encoding="utf-8") as f:
        f.write("noch ein Satz\tone more sentence\n")
    assert reported_end(str(model_dir), end_record(settings, "auto", True)) == report
    # A run without the no-repeat rule records none: its report matches (as one written
    # before the rule existed does).
    assert "no_repeat_ngram_size" not in report["end"]
    assert reported_end(str(model_dir), end_record(settings, "auto", True, 0)) == report


def test_a_model_dir_copied_or_moved_elsewhere_reports_as_it_did(ended, tmp_path):
    model_dir, settings, report = ended
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(model_dir, copy)
    moved = dict(settings, model_dir=str(copy))
    assert reported_end(str(copy), end_record(moved, "auto", True)) == report
    # A record that still names the model_dir it was written in matches too.
    old = json.loads((copy / "report.json").read_text(encoding="utf-8"))
    old["end"]["settings"]["model_dir"] = str(model_dir)
    (copy / "report.json").write_text(json.dumps(old), encoding="utf-8")
    assert reported_end(str(copy), end_record(moved, "auto", True)) == old
    # The copy's own changes still count: a checkpoint more computes its end again.
    (copy / "checkpoints" / "ckpt-12.index").write_bytes(b"")
    assert reported_end(str(copy), end_record(moved, "auto", True)) is None


@pytest.mark.parametrize("change", ["alpha", "alpha_grid", "test_report", "no_repeat",
                                    "train_steps",
                                    "average_last", "new_checkpoint", "test_text", "dev_text",
                                    "served_checkpoint_gone", "stopped_early"])
def test_anything_the_end_read_changed_computes_it_again(ended, change):
    model_dir, settings, _ = ended
    alpha, test_report, no_repeat = "auto", True, 0
    if change == "alpha":
        alpha = "1.2"
    elif change == "no_repeat":
        no_repeat = 4
    elif change == "test_report":
        test_report = False
    elif change in ("train_steps", "average_last"):
        settings["train"][change] += 4
    elif change == "alpha_grid":  # a version of tfnmt that chooses α among other values
        report = json.loads((model_dir / "report.json").read_text(encoding="utf-8"))
        report["end"]["alpha_grid"] = [0.6, 1.2, 1.8, 2.4]
        (model_dir / "report.json").write_text(json.dumps(report), encoding="utf-8")
    elif change == "new_checkpoint":
        (model_dir / "checkpoints" / "ckpt-12.index").write_bytes(b"")
    elif change == "stopped_early":  # at step 8 of 12, with the same settings as then
        settings["train"]["train_steps"] = 12
        report = json.loads((model_dir / "report.json").read_text(encoding="utf-8"))
        report["end"] = end_record(settings, alpha, test_report)
        (model_dir / "report.json").write_text(json.dumps(report), encoding="utf-8")
    elif change in ("test_text", "dev_text"):
        with open(settings["data"]["files"][change[:-5]], "a", encoding="utf-8") as f:
            f.write("noch ein Satz\tone more sentence\n")
    else:
        os.remove(model_dir / "averaged" / "ckpt-8.index")
    assert reported_end(str(model_dir),
                        end_record(settings, alpha, test_report, no_repeat)) is None


@pytest.mark.parametrize("content", [None, "", '{"dev_greedy": {"bleu": 1.5', "[]",
                                     '{"dev_greedy": {"bleu": 1.5}, "test": null}'])
def test_no_report_a_damaged_one_or_one_without_its_end_computes_it(ended, content):
    model_dir, settings, _ = ended
    if content is None:
        os.remove(model_dir / "report.json")
    else:
        (model_dir / "report.json").write_text(content, encoding="utf-8")
    assert reported_end(str(model_dir), end_record(settings, "auto", True)) is None


def test_the_embedded_corpus_is_fingerprinted_by_its_files(tmp_path):
    settings = {"model_dir": str(tmp_path), "data": {"dataset": "embedded"}, "train": {}}
    record = end_record(settings, "auto", True)
    assert set(record["scored_text"]["embedded"]) == {"train.tsv.gz", "dev.tsv.gz",
                                                      "test.tsv.gz"}
    assert record["checkpoints"] == []
