"""The command-line programs: train, export, translate, evaluate (absl flags). Run as
`python <name>.py` from a checkout or as `tfnmt-<name>` once installed (`pip install .`)."""
