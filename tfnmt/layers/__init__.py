"""Keras layers of the Transformer, one per file (keras-hub style)."""
from tfnmt.layers.attention import MultiHeadAttention
from tfnmt.layers.decoder_layer import TransformerDecoderLayer
from tfnmt.layers.dropout import Dropout
from tfnmt.layers.embedding import PositionalEncoding, TokenEmbedding
from tfnmt.layers.encoder_layer import TransformerEncoderLayer
from tfnmt.layers.feed_forward import FeedForward
from tfnmt.layers.layer_norm import LayerNorm

__all__ = [
    "Dropout",
    "FeedForward",
    "LayerNorm",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
]
