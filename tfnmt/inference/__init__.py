"""Inference: searches, scoring and the exported translators.

  decoding.py            `dynamic_decode`, the one decoding loop, and its strategies' interface;
                         greedy search; exact top-k
  beam_search.py         the beam strategy, with length penalty
  evaluation.py          loss/perplexity, batched translation, sacreBLEU/chrF/TER
  serving.py             the in-graph translator and the versioned SavedModel export
  session_loader.py      TensorFlow's C++ SavedModel loader (TF Serving's) via ctypes
  ctranslate2_export.py  the model as a CTranslate2 model
"""
