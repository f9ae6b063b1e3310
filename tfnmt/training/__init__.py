"""Training: one run in a model_dir, from prepared data to the end-of-run report.

  experiment.py   one run: settings, data, model, the loop, averaging, final evaluation
  trainer.py      `Trainer` (the distributed train step and the loop), checkpoints, averaging
  stats.py        `TrainingStats`: the windowed log line and TensorBoard scalars
  schedule.py     the Noam learning-rate schedule and the paper's Adam
  losses.py       label-smoothed, padding-masked cross-entropy and token accuracy
  distribute.py   strategies, cluster roles, mixed precision, `PreReducedAdam`
  summaries.py    attention heatmaps, process RSS
  report.py       the end-of-run report: test scores, samples, next commands
"""
