"""tfnmt: the Transformer of "Attention Is All You Need" for TensorFlow/Keras 3.

Packages by role (each package's __init__ lists its modules):
  data/        raw text, SentencePiece, TFRecords, the tf.data pipeline
  layers/      one Keras layer per file (embeddings, attention, FFN, encoder/decoder layers)
  model/       the Transformer, presets, key/value caches
  training/    one run in a model_dir: the loop, losses, schedule, distribution, report
  inference/   decoding loop and strategies (greedy, beam), evaluation, SavedModel and
               CTranslate2 exports, TF Serving's C++ loader

Shared by all:
  paths.py        the names of the files in a model_dir
  checkpoints.py  loading a trained model from a model_dir, its checkpoint index, its lock
  fast_ops.py     the switch between tfnmt's hand-written fast ops and stock ones
  allocator.py    the C memory allocator of the entry points (tcmalloc or tuned glibc)
  cpu_kernels.py  oneDNN's kernels for training on AVX2 CPUs, where TensorFlow leaves them off
  cli.py          what the entry points share
  text_lines.py   text files of one sentence per line, read and written as they stream
  copy_task.py    the Annotated Transformer's synthetic copy task
"""
import os

# tfnmt is TensorFlow-native (tf.data, tf.distribute, SavedModel); Keras must use that backend.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"
