"""The windowed training log: what `train.py` prints every `--log_every` updates and writes
to TensorBoard."""
import time

from tfnmt.training.summaries import rss_bytes, write_scalars


class TrainingStats:
    """Accumulates train steps' outputs over a window of updates and reports them.

    Loss is per real target token over the window; speed counts real target tokens per second
    of training (time spent in `pause`d work such as evaluation excluded); the ETA extrapolates
    the run's rate since `first_step`.

    Args:
      train_steps: the update count the run ends at (for the ETA).
      first_step: the update count the run started (or resumed) from.
      writer: a `tf.summary` writer for the scalars, or None.
      log: called with each line.

    Example:
      stats = TrainingStats(train_steps=1000, first_step=0, writer=writer)
      stats.update(trainer.train_step(iterator))
      stats.report(step, learning_rate)   # prints one line, writes the scalars, resets
    """

    def __init__(self, train_steps, first_step, writer=None, log=print):
        self.train_steps = train_steps
        self.first_step = first_step
        self.writer = writer
        self.log = log
        self.skipped = 0  # updates skipped by fp16 loss scaling, over the whole run
        self.run_start = time.monotonic()
        self._reset()

    def _reset(self):
        self.loss_sum = self.tokens = self.grad_norm = self.padding = 0.0
        self.steps = 0
        self.window_start = time.monotonic()

    def update(self, outputs):
        """Adds one update's outputs to the window.

        Args:
          outputs: `Trainer.train_step`'s dict (loss, target_tokens, grad_norm, padding_fraction;
            tensors or floats).
        """
        out = {k: float(v) for k, v in outputs.items()}
        self.loss_sum += out["loss"] * out["target_tokens"]
        self.tokens += out["target_tokens"]
        self.grad_norm += out["grad_norm"]
        self.padding += out["padding_fraction"]
        self.steps += 1

    def pause(self, seconds):
        """Leaves non-training work out of the speed and the ETA.

        Args:
          seconds: the time it took.
        """
        self.window_start += seconds
        self.run_start += seconds

    def report(self, step, learning_rate):
        """Logs the window ending at update `step`, writes its scalars, starts a new window.

        Args:
          step: the optimizer's update count.
          learning_rate: the current rate.

        Returns:
          The scalars: loss, learning_rate, grad_norm, tokens_per_sec, rss_gib, padding_fraction.
        """
        now = time.monotonic()
        steps = max(self.steps, 1)
        scalars = {
            "loss": self.loss_sum / max(self.tokens, 1.0),
            "learning_rate": learning_rate,
            "grad_norm": self.grad_norm / steps,
            "tokens_per_sec": self.tokens / max(now - self.window_start, 1e-9),
            "rss_gib": rss_bytes() / 2 ** 30,
            "padding_fraction": self.padding / steps,
        }
        rate = (step - self.first_step) / max(now - self.run_start, 1e-9)
        eta = (self.train_steps - step) / max(rate, 1e-9)
        self.log(f"step {step:6d}/{self.train_steps} | loss {scalars['loss']:.3f} | "
                 f"lr {learning_rate:.2e} | {scalars['tokens_per_sec']:,.0f} tgt tok/s | "
                 f"RSS {scalars['rss_gib']:.2f} GiB | ETA {int(eta // 60)}m{int(eta % 60):02d}s"
                 + (f" | {self.skipped} overflowing updates skipped" if self.skipped else ""))
        if self.writer is not None:
            with self.writer.as_default():
                write_scalars(scalars, step)
        self._reset()
        return scalars
