"""Training: one run in a model_dir, from prepared data to the end-of-run report.

  experiment.py   one run: settings, data, model, the loop, averaging, final evaluation
  fine_tune.py    starting a run from another run's weights (`--init_from`)
  best.py         the best checkpoint by a dev metric, early stopping
  evaluator.py    the dev evaluation during training
  settings.py     a run's settings and which of them a resumed run must keep
  trainer.py      `Trainer` (the distributed train step and the loop), checkpoints, averaging
  stop_signals.py Ctrl-C and SIGTERM stop the loop after an update, which is saved
  stats.py        `TrainingStats`: the windowed log line and TensorBoard scalars
  schedule.py     the Noam learning-rate schedule and the paper's Adam
  losses.py       label-smoothed, padding-masked cross-entropy and token accuracy
  distribute.py   strategies, cluster roles, mixed precision, `PreReducedAdam`
  summaries.py    TensorBoard tags and descriptions, HParams, attention heatmaps, RSS
  report.py       the end-of-run report: test scores, samples, next commands
  finished.py     a run that has ended, started again, prints its report instead of redoing it
"""
