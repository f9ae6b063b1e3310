"""Inference: searches, scoring and the exported translators.

  decoding.py            `dynamic_decode`, the one decoding loop, and its strategies' interface;
                         target prefixes; exact top-k; greedy search by full recomputation
  greedy_search.py       the greedy and random-sampling strategies
  beam_search.py         the beam strategy, with length penalty
  length_penalty.py      the length penalty chosen on dev at the end of training
  search_memory.py       a search's memory per sentence; sentences searched at once that fit
  scoring.py             forced decoding: log P(target | source) of given translations
  evaluation.py          loss/perplexity, batched translation
  sacrebleu_scores.py    sacreBLEU's BLEU, chrF and TER with signatures (no TensorFlow)
  significance.py        two systems' scores compared: paired randomization and bootstrap
  bleu_tokenization.py   BLEU's tokenization, chosen by the target language's script
  serving.py             the in-graph translator (`TranslationModule`) and its signatures
  serving_precision.py   bf16 or float32 products, chosen on the serving machine
  saved_model.py         the versioned SavedModel export, checked by the C++ loader
  loading.py             a model_dir's or an export's signatures as Python functions
  decoding_threads.py    CPU threads of a process that decodes in parallel searches
  session_loader.py      TensorFlow's C++ SavedModel loader (TF Serving's) via ctypes
  ctranslate2_export.py  the model as a CTranslate2 model
"""
