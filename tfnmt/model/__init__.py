"""Model: the encoder-decoder Transformer built from tfnmt.layers.

  transformer.py  `Transformer`: encode / decode / decode_step / call
  presets.py      tiny / cpu / small / base / big: model sizes with their training defaults
  kv_cache.py     the decoder's keys/values: plain and in-place caches, a search's DecoderCache
"""
