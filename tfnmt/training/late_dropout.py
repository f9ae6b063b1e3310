"""Residual dropout that starts once a run has seen its training data a number of times
(`train.py --dropout_from_epoch`).

Without dropout a small model learns fastest, which a short run needs; a long one on a small
corpus then fits its training data (dev perplexity rises) and dropout helps from there. A
`DropoutStart` keeps the model's residual and embedding dropout at 0 until the update at which
the run has trained on `epochs` times the training split's target tokens, then sets it to the
model's rate; the train step is traced again there, once (a dropout rate is a constant of the
trace). The update is measured from the target tokens of the run's first updates and saved with
the run's settings, so a resumed run starts dropout at the same update.
"""
import math


class DropoutStart:
    """When a run's residual and embedding dropout starts.

    Args:
      layers: the dropout layers to start (`Transformer.residual_dropouts()`).
      rate: their rate once started (> 0).
      epochs: start after this many epochs of the training data (> 0).
      epoch_tokens: target tokens (EOS included) in one epoch of the training data.
      first_step: the optimizer's step when this run started (or resumed).
      start_step: the update saved by an earlier part of the run, or None to measure it.
      measure_steps: updates whose target tokens measure the tokens per update.

    Example:
      start = DropoutStart(model.residual_dropouts(), 0.1, 7.5, 1_255_868, first_step=0)
      if start.update(step, target_tokens):  # after each update
          trainer.retrace()
    """

    def __init__(self, layers, rate, epochs, epoch_tokens, first_step, start_step=None,
                 measure_steps=100):
        if rate <= 0 or epochs <= 0 or epoch_tokens <= 0:
            raise ValueError(f"need a positive rate, epochs and epoch_tokens, got {rate}, "
                             f"{epochs}, {epoch_tokens}")
        self.layers, self.rate = layers, float(rate)
        self.epochs, self.epoch_tokens = float(epochs), float(epoch_tokens)
        self.first_step, self.measure_steps = int(first_step), int(measure_steps)
        self.start_step = start_step
        self.epoch_step = None  # the update where `epochs` passed, once measured by this run
        self.tokens = 0.0  # target tokens of this run's updates so far
        self.started = start_step is not None and first_step >= start_step
        for layer in layers:
            layer.rate = self.rate if self.started else 0.0

    def update(self, step, target_tokens):
        """Called after each update.

        Args:
          step: the optimizer's step (updates applied).
          target_tokens: the update's real target tokens.

        Returns:
          True when dropout starts at this update (the train step must be traced again).
        """
        if self.started:
            return False
        if self.start_step is None:
            self.tokens += target_tokens
            done = step - self.first_step
            if done < self.measure_steps:
                return False
            per_update = self.tokens / done
            self.epoch_step = self.first_step + math.ceil(
                self.epochs * self.epoch_tokens / per_update)
            # An epoch count passed while its updates were being counted starts dropout now,
            # and this update is the one saved, so that a resumed run starts it here too.
            self.start_step = max(self.epoch_step, step)
        if step < self.start_step:
            return False
        for layer in self.layers:
            layer.rate = self.rate
        self.started = True
        return True
