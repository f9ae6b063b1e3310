"""tfnmt: the Transformer of "Attention Is All You Need" for TensorFlow/Keras 3.

Modules by role:
  layers/         one Keras layer per file (embeddings, attention, FFN, encoder/decoder layers)
  model.py        the encoder-decoder Transformer (encode / decode / decode_step / call)
  presets.py      tiny / cpu / small / base / big: model sizes with their training defaults
  schedule.py     Noam learning-rate schedule and the paper's Adam
  losses.py       label-smoothed, padding-masked cross-entropy and token accuracy
  corpus.py       raw parallel text: embedded corpus, TFDS datasets, local files
  tfds_embedded.py  the embedded corpus as a local TFDS builder
  tokenizer.py    joint SentencePiece vocabulary, applied with tensorflow-text
  special_tokens.py  the reserved ids: PAD, UNK, BOS, EOS
  records.py      TFRecord shards + manifest
  data.py         the length-bucketed, token-budget tf.data pipeline
  distribute.py   strategies, cluster roles, mixed precision
  training.py     the custom training loop, checkpoints, averaging
  experiment.py   one run in a model_dir (settings, loop, evaluation)
  evaluation.py   loss/perplexity, batched translation, sacreBLEU/chrF
  summaries.py    attention heatmaps
  decoding.py     the decoding loop and its strategies' interface; greedy; exact top-k
  kv_cache.py     decoder keys/values: plain and in-place caches, a search's DecoderCache
  beam_search.py  the beam strategy, with length penalty
  checkpoints.py  loading a trained model from a model_dir
  paths.py        the names of the files in a model_dir
  report.py       the end-of-run report: test scores, samples, next commands
  serving.py      the in-graph translator and versioned SavedModel export
  ctranslate2_export.py  the model as a CTranslate2 model
  allocator.py    the C memory allocator of the entry points (tcmalloc or tuned glibc)
  fast_ops.py     the switch between tfnmt's hand-written fast ops and stock ones
  copy_task.py    the Annotated Transformer's synthetic copy task
"""
import os

# tfnmt is TensorFlow-native (tf.data, tf.distribute, SavedModel); Keras must use that backend.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"
