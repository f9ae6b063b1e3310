"""tfnmt: the Transformer of "Attention Is All You Need" for TensorFlow/Keras 3.

Modules by role:
  layers/      one Keras layer per file (embeddings, attention, FFN, encoder/decoder layers)
  model.py     the encoder-decoder Transformer (encode / decode / call)
  presets.py   tiny / small / base / big configurations
  schedule.py  Noam learning-rate schedule and the paper's Adam
  losses.py    label-smoothed, padding-masked cross-entropy and token accuracy
  decoding.py  greedy decoding
  copy_task.py the Annotated Transformer's synthetic copy task
"""
import os

# tfnmt is TensorFlow-native (tf.data, tf.distribute, SavedModel); Keras must use that backend.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"
