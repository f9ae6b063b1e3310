"""Ctrl-C (SIGINT), SIGTERM (what `kill`, Kubernetes and Slurm send before killing a job) and
SIGHUP (the terminal closed: an ssh connection lost) during training: the loop finishes its
update, saves a checkpoint of it and stops, instead of dying with up to --checkpoint_every
updates unsaved.

    with StopSignals() as stop:
        trainer(iterator, train_steps, keeper=keeper, stop=stop)  # raises TrainingInterrupted

A second signal acts as it would have without this (Ctrl-C: KeyboardInterrupt), so a user who
does not want to wait for the save can still stop at once. Only the main thread can install
signal handlers; elsewhere, and for a signal the process ignores (a background job's SIGINT),
nothing changes. `stopping_at_once` is for the waits in TensorFlow's C++ where no Python
handler runs.
"""
import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class TrainingInterrupted(Exception):
    """A stop signal ended training after an update, which was saved.

    Attributes:
      signum: the signal's number (the process exits with 128 + signum, as a shell reports it).
      step: the last applied update.
      checkpoint: the checkpoint that holds it, or None where nothing was saved.
    """

    def __init__(self, signum, step, checkpoint):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        saved = f", saved in {checkpoint}" if checkpoint else ""
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step:,d}"
                         f"{saved}; run the same command to resume")


class StopSignals:
    """A context manager recording the first SIGINT, SIGTERM or SIGHUP in `received` (its
    number; None before), so the training loop can stop cleanly at its next update."""

    def __init__(self, signals=SIGNALS):
        self.signals = signals
        self.received = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                handler = signal.getsignal(signum)
                if handler is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._record)
        return self

    def _record(self, signum, frame):
        self.received = self.received or signum
        self._restore()  # a second signal acts as before

    def _restore(self):
        for signum, handler in self._previous.items():  # None: a handler not set from Python
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous = {}

    def __exit__(self, *exc_info):
        self._restore()
        return False


@contextlib.contextmanager
def stopping_at_once():
    """A context manager for a wait of the main thread inside TensorFlow's C++ (joining a
    cluster, a key of its coordination service, a barrier), which holds the interpreter while
    it waits: Python runs a signal's handler only once such a call returns, and a wait for a
    worker that never starts never returns, so Ctrl-C did nothing. Within it, SIGINT, SIGTERM
    and SIGHUP act as the system's default: they end the process at once (a wait has no work
    under way to save; the shell reports the signal). A signal whose handler TensorFlow's
    runtime installs (a cluster worker's SIGTERM, its notice of preemption, set as the cluster
    forms) is left to TensorFlow, and one the process ignores stays ignored.
    """
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not None and handler is not signal.SIG_IGN:  # None: set in C
                previous[signum] = signal.signal(signum, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if signal.getsignal(signum) is signal.SIG_DFL:  # else TensorFlow's own since
                signal.signal(signum, handler)
