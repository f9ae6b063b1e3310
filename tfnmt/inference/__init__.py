"""Inference: searches, scoring and the exported translators.

  decoding.py            `dynamic_decode`, the one decoding loop, and its strategies' interface;
                         greedy search, random sampling, target prefixes; exact top-k
  beam_search.py         the beam strategy, with length penalty
  scoring.py             forced decoding: log P(target | source) of given translations
  evaluation.py          loss/perplexity, batched translation, sacreBLEU/chrF/TER
  serving.py             the in-graph translator (`TranslationModule`) and its signatures
  saved_model.py         the versioned SavedModel export, checked by the C++ loader
  loading.py             a model_dir's or an export's signatures as Python functions
  session_loader.py      TensorFlow's C++ SavedModel loader (TF Serving's) via ctypes
  ctranslate2_export.py  the model as a CTranslate2 model
"""
