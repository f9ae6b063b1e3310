"""Data: raw parallel text to batches of subword ids.

  corpus.py          raw parallel text: the embedded corpus, TFDS datasets, local files
  tfds_embedded.py   the embedded corpus as a local TFDS builder
  tokenizer.py       a SentencePiece model, trained and applied in-graph with tensorflow-text
  vocabulary.py      a model's vocabulary: one shared SentencePiece model or one per side
  special_tokens.py  the reserved ids: PAD, UNK, BOS, EOS
  filters.py         training-pair filters: length ratio, duplicates, identical sides
  records.py         TFRecord shards + manifest with checksums, rebuilt where damaged;
                     several training corpora apart
  data_dir_lock.py   keeps a prepared directory unchanged while runs that share it read it
  de-en/             the embedded German-English corpus
  pipeline.py        the length-bucketed, token-budget tf.data pipeline; weighted corpora
"""
