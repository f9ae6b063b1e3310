"""Translate text with a trained model (checkpoint) or an exported SavedModel.

`python translate.py --help` lists its flags; the code is tfnmt/programs/translate.py. Installed
with `pip install .`, the same program is `tfnmt-translate`.
"""
from tfnmt.programs.translate import run

if __name__ == "__main__":
    run()
