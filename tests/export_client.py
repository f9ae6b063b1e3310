"""Run as a subprocess: load an export with only tensorflow + tensorflow_text (no tfnmt) and
print the serving signatures' outputs for the sentences given as JSON on stdin."""
import json
import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops the graph uses

assert "tfnmt" not in sys.modules
loaded = tf.saved_model.load(sys.argv[1])
sentences = json.load(sys.stdin)
best = loaded.signatures["serving_default"](sentences=tf.constant(sentences, tf.string))
n_best = loaded.signatures["translate_n_best"](sentences=tf.constant(sentences, tf.string))
print(json.dumps({
    "translations": [t.decode("utf-8") for t in best["translations"].numpy()],
    "scores": best["scores"].numpy().tolist(),
    "n_best": [[t.decode("utf-8") for t in row] for row in n_best["translations"].numpy()],
    "tfnmt_imported": "tfnmt" in sys.modules,
}))
