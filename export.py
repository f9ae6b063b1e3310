"""Export a trained tfnmt model as a versioned SavedModel for TensorFlow Serving.

`python export.py --help` lists its flags; the code is tfnmt/programs/export.py. Installed
with `pip install .`, the same program is `tfnmt-export`.
"""
from tfnmt.programs.export import run

if __name__ == "__main__":
    run()
