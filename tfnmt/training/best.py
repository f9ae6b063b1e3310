"""The best checkpoint by a dev metric, and early stopping.

<model_dir>/best/ holds the model's weights at the dev evaluation that scored best so far
(`ckpt-<step>`, weights only) and `best.json`: the metric, its best value and step, how many
evaluations since then did not improve on it, and the step evaluated last. `export.py
--checkpoint=best` exports it.
"""
import logging
import math
import os

import tensorflow as tf

from tfnmt.checkpoints import checkpoint_prefixes, read_best_state
from tfnmt.paths import BEST_STATE
from tfnmt.training.settings import write_json

# Dev metrics a run can keep its best checkpoint by, and whether higher is better.
METRICS = {"bleu": True, "chrf": True, "loss": False, "perplexity": False, "accuracy": True}


def _measure(state):
    """What a best state's value measures: its metric, and for BLEU its tokenization."""
    if state.get("metric") != "bleu":
        return state.get("metric")
    return f"bleu (tokenization {state.get('bleu_tokenize', '13a')})"


class BestCheckpoint:
    """Keeps the checkpoint with the best dev metric and counts evaluations without improvement.

    Args:
      directory: where the best checkpoint and its state live (<model_dir>/best).
      model: the model whose weights are saved.
      metric: a key of METRICS ("bleu" or "loss" in practice).
      patience: evaluations without improvement after which `should_stop` is true (0: never).
      write: whether this process writes (the chief); others only follow the state in memory.
      bleu_tokenize: the sacreBLEU tokenization of the "bleu" metric; a best BLEU recorded
        with another (13a where the state names none) is not compared with this run's.

    Example:
      best = BestCheckpoint(os.path.join(model_dir, "best"), model, "bleu", patience=3)
      best.update(step, metrics)   # True when this evaluation is the best so far
      if best.should_stop: ...
    """

    def __init__(self, directory, model, metric="bleu", patience=0, write=True,
                 bleu_tokenize="13a"):
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
        self.directory = directory
        self.model = model
        self.metric = metric
        self.patience = patience
        self.write = write
        self.state = {"metric": metric, "value": None, "step": None, "checkpoint": None,
                      "evaluations_without_improvement": 0}
        if metric == "bleu":
            self.state["bleu_tokenize"] = bleu_tokenize
        saved = read_best_state(directory)
        if saved and _measure(saved) == _measure(self.state):
            self.state.update(saved)
        elif saved:  # its checkpoint is kept until one chosen by the new metric replaces it
            self.state["checkpoint"] = saved.get("checkpoint")
            logging.warning("%s: the best checkpoint was chosen by %s; now choosing by %s",
                            directory, _measure(saved), _measure(self.state))
        if write:
            self._remove_others()

    @property
    def should_stop(self):
        """Whether `patience` evaluations in a row did not improve on the best one."""
        return bool(self.patience) and \
            self.state["evaluations_without_improvement"] >= self.patience

    def improves(self, value):
        """Whether a metric value is better than the best so far (a NaN never is)."""
        if value is None or math.isnan(value):
            return False
        best = self.state["value"]
        return best is None or (value > best if METRICS[self.metric] else value < best)

    def update(self, step, metrics):
        """Records an evaluation; saves the weights when it is the best so far.

        Args:
          step: the update count the model was evaluated at.
          metrics: the dev metrics (`Evaluator`'s dict).

        Returns:
          True when this evaluation is the new best.
        """
        # The weights evaluated last, evaluated again: the end of a finished run run again
        # (under another search rule its scores would not compare with those recorded), or the
        # final evaluation of the best weights. (States written before "evaluated_step" name
        # only the best step.)
        if step == self.state.get("evaluated_step", self.state["step"]):
            return False
        self.state["evaluated_step"] = step
        value = metrics[self.metric]  # None: not measured (no dev pair within max_length)
        value = None if value is None else float(value)
        if not self.improves(value):
            self.state["evaluations_without_improvement"] += 1
            if self.write:  # best/ is not there yet if no evaluation counted so far
                os.makedirs(self.directory, exist_ok=True)
                write_json(os.path.join(self.directory, BEST_STATE), self.state)
            return False
        name = f"ckpt-{step}"
        if self.write:
            os.makedirs(self.directory, exist_ok=True)
            tf.train.Checkpoint(model=self.model).write(os.path.join(self.directory, name))
        self.state.update(value=value, step=step, checkpoint=name,
                          evaluations_without_improvement=0)
        if self.write:  # the state names the new checkpoint before the old one goes
            write_json(os.path.join(self.directory, BEST_STATE), self.state)
            self._remove_others()
        return True

    def _remove_others(self):
        """Deletes checkpoints in the directory other than the one the state names (left by a
        run killed between writing a new best and recording it)."""
        keep = self.state["checkpoint"]
        for prefix in checkpoint_prefixes(self.directory):
            if os.path.basename(prefix) != keep:
                for path in tf.io.gfile.glob(prefix + ".*"):
                    tf.io.gfile.remove(path)
