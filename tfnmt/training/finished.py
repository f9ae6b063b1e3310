"""A finished run started again: the same command on a model_dir whose run has already ended
(trained to its last update, averaged, evaluated on dev and reported on test) prints the end it
reported (<model_dir>/report.json) instead of computing it again, and exits at once.

The report is reused only when everything its end read is as it was then: the run's settings,
the end's flags (--alpha, --test_report, --no_repeat_ngram_size) and the grid α is chosen from,
the checkpoints in checkpoints/, the dev and test text, and the checkpoint the test report
translated; not the model_dir's path, so a model_dir copied or moved elsewhere reports as it
did. Any difference (more updates asked for, another --average_last or --alpha, a changed test
file, a deleted averaged/) computes the end again, as does deleting report.json; so does a run
that stopped early (its end says why, and how to train on). Without TensorFlow: the answer
comes before it loads.
"""
import json
import os

from tfnmt import paths
from tfnmt.data.corpus import input_fingerprint
from tfnmt.inference.length_penalty import ALPHA_GRID


def end_record(settings, alpha, test_report, no_repeat_ngram_size=0):
    """What the end of a run reads besides the code, to be kept in its report.

    Args:
      settings: the run's settings (its model_dir, data and train sections).
      alpha: train.py's --alpha (a number, or "auto").
      test_report: train.py's --test_report.
      no_repeat_ngram_size: train.py's --no_repeat_ngram_size (recorded where > 0, so that the
        end of a run reported without it matches a record made without it).

    Returns:
      A JSON-able dict.
    """
    data = settings["data"]
    scored = {split: files for split, files in (data.get("files") or {}).items()
              if split != "train"}  # the training text is the checkpoints' business
    checkpoints = paths.checkpoint_prefixes(os.path.join(settings["model_dir"],
                                                         paths.CHECKPOINTS))
    settings = _without_location(settings)
    rule = {"no_repeat_ngram_size": int(no_repeat_ngram_size)} if no_repeat_ngram_size else {}
    return json.loads(json.dumps({
        "settings": settings, "alpha": str(alpha), "alpha_grid": ALPHA_GRID,
        "test_report": bool(test_report), **rule,
        "checkpoints": [os.path.basename(prefix) for prefix in checkpoints],
        "scored_text": input_fingerprint(data["dataset"], scored, data.get("tfds_data_dir"))}))


def reported_end(model_dir, record):
    """The report of a run that ended with exactly `record` (`end_record`), else None.

    Args:
      model_dir: the run's directory.
      record: `end_record` of the settings and flags of the run starting now.

    Returns:
      report.json's dict ("dev_greedy", "test", "end"), or None: no report, a report of another
      end, a run that stopped before its last update, or the checkpoint its test scores were
      taken from is gone.
    """
    try:
        with open(os.path.join(model_dir, paths.REPORT), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError):  # none yet, or unreadable: the end is computed again
        return None
    if not isinstance(report, dict) or not isinstance(report.get("end"), dict) \
            or not report.get("dev_greedy"):
        return None
    kept = report["end"]
    if isinstance(kept.get("settings"), dict):  # a record that still names its model_dir
        kept = dict(kept, settings=_without_location(kept["settings"]))
    if kept != record:
        return None
    # Trained to its last update: a run that stopped early computes its end again, which says
    # why it stopped and how to train on.
    last = record["settings"].get("train", {}).get("train_steps")
    if record["checkpoints"][-1:] != [f"ckpt-{last}"]:
        return None
    test = report.get("test")
    if test and not os.path.exists(os.path.join(model_dir, test["checkpoint"]) + ".index"):
        return None
    return report


def _without_location(settings):
    """The settings without the model_dir's path (report.json is read from inside it) and the
    vocabulary's fingerprint, which a run adds once its data is prepared (the checkpoints hold
    that vocabulary's model)."""
    return {k: v for k, v in settings.items() if k not in ("model_dir", "vocab_fingerprint")}
