"""Train a Transformer translation model (tfnmt).

`python train.py --help` lists its flags; the code is tfnmt/programs/train.py. Installed
with `pip install .`, the same program is `tfnmt-train`.
"""
from tfnmt.programs.train import run

if __name__ == "__main__":
    run()
