"""Export a trained tfnmt model as a TensorFlow Serving SavedModel.

Not implemented yet (tracked in the decoding/export issue): running it prints this help and
exits with status 2 rather than pretending to export.
"""
import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Training directory to export from.")
flags.DEFINE_string("export_dir", None, "Where versioned SavedModels are written.")


def main(argv):
    del argv
    print(FLAGS.main_module_help() if hasattr(FLAGS, "main_module_help") else __doc__)
    print("\nexport.py is not implemented yet.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    app.run(main)
