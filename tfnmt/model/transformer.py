"""The encoder-decoder Transformer (paper §3) as a Keras model with encode / decode / call."""
import contextlib

import keras
import tensorflow as tf

from tfnmt import fast_ops
from tfnmt.data.special_tokens import PAD_ID
from tfnmt.layers import (PositionalEncoding, TokenEmbedding, TransformerDecoderLayer,
                          TransformerEncoderLayer)
from tfnmt.layers.dropout import Dropout
from tfnmt.layers.layer_norm import LayerNorm
from tfnmt.layers.linear import (concatenated_kernels, linear, linear_slices,
                                 pretransposed_kernels, sliced_kernels)
from tfnmt.model import kv_cache

# A decoding step's output layer as this many products by column blocks of its kernel, for an
# output vocabulary of at least SLICED_VOCAB tokens (`Transformer.decoding_products`).
VOCAB_SLICES = 2
SLICED_VOCAB = 1024


def causal_mask(length):
    """The decoder's self-attention mask.

    Args:
      length: T.

    Returns:
      [1, T, T] bool, True where position i may attend to j (j <= i).
    """
    return tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)[None]


@keras.saving.register_keras_serializable(package="tfnmt")
class Transformer(keras.Model):
    """The encoder-decoder Transformer: token ids in, float32 logits out.

    `vocab_size` with `share_embeddings=True` (the default) is the paper's shared vocabulary: one
    matrix embeds source and target tokens and projects to the softmax (§3.4). With
    `share_embeddings=False` the source and target get their own embeddings (and may have
    their own vocabularies: `source_vocab_size`/`target_vocab_size`). The target embedding
    projects to the softmax unless `tie_output=False`, which gives the model its own output
    layer (with shared embeddings too).

    Args:
      vocab_size: the shared vocabulary's size (or give both of the next two).
      num_layers: encoder and decoder layers (paper: 6).
      d_model: the model width (paper: 512).
      num_heads: attention heads (paper: 8).
      d_ff: the feed-forward width (paper: 2048).
      dropout: dropout on embeddings and sublayer outputs (paper: 0.1).
      attention_dropout: dropout on attention weights.
      ffn_dropout: dropout inside the feed-forward block.
      activation: "relu" (paper) or "gelu".
      norm_first: pre-norm (LayerNorm before each sublayer, a final LayerNorm per stack)
        instead of the paper's post-norm.
      position: "sinusoidal" (paper) or "learned".
      max_length: the longest position the model can embed.
      share_embeddings: one embedding matrix for source and target (paper §3.4).
      tie_output: the target embedding also projects to the softmax.
      source_vocab_size, target_vocab_size: separate vocabularies' sizes.
      num_encoder_layers, num_decoder_layers: stack depths apart (default: num_layers).
      layer_norm_epsilon: LayerNorm's epsilon.

    Example:
      model = Transformer(vocab_size=8000, **get_preset("cpu"))
      logits = model((source_ids, target_in))          # [B, T, V] float32, teacher forcing
      memory, source_padding = model.encode(source_ids)
      cache = model.initial_cache(memory)
      logits, cache = model.decode_step(bos_ids, 0, cache, source_padding)  # [B, V]
    """

    def __init__(self, vocab_size=None, num_layers=6, d_model=512, num_heads=8, d_ff=2048,
                 dropout=0.1, attention_dropout=0.0, ffn_dropout=0.0, activation="relu",
                 norm_first=False, position="sinusoidal", max_length=1024,
                 share_embeddings=True, tie_output=True, source_vocab_size=None,
                 target_vocab_size=None, num_encoder_layers=None, num_decoder_layers=None,
                 layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        source_vocab_size = source_vocab_size or vocab_size
        target_vocab_size = target_vocab_size or vocab_size
        if not source_vocab_size or not target_vocab_size:
            raise ValueError("give vocab_size, or source_vocab_size and target_vocab_size")
        if share_embeddings and source_vocab_size != target_vocab_size:
            raise ValueError("share_embeddings needs one vocabulary: source_vocab_size "
                             f"{source_vocab_size} != target_vocab_size {target_vocab_size}")
        self.settings = dict(
            vocab_size=vocab_size, num_layers=num_layers, d_model=d_model, num_heads=num_heads,
            d_ff=d_ff, dropout=dropout, attention_dropout=attention_dropout,
            ffn_dropout=ffn_dropout, activation=activation, norm_first=norm_first,
            position=position, max_length=max_length, share_embeddings=share_embeddings,
            tie_output=tie_output, source_vocab_size=source_vocab_size,
            target_vocab_size=target_vocab_size,
            num_encoder_layers=num_encoder_layers or num_layers,
            num_decoder_layers=num_decoder_layers or num_layers,
            layer_norm_epsilon=layer_norm_epsilon)
        self.d_model = d_model
        self.norm_first = norm_first
        self.max_length = max_length
        policy = self.dtype_policy

        self.source_embedding = TokenEmbedding(source_vocab_size, d_model, dtype=policy,
                                               name="source_embedding")
        if share_embeddings:
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = TokenEmbedding(target_vocab_size, d_model, dtype=policy,
                                                   name="target_embedding")
        self.output_projection = None
        if not tie_output:  # its own [D, V] output layer, shared embeddings or not
            self.output_projection = keras.layers.Dense(target_vocab_size, use_bias=False,
                                                        dtype=policy, name="output_projection")
        self.positions = PositionalEncoding(d_model, position, max_length, dtype=policy,
                                            name="positions")
        self.embedding_dropout = Dropout(dropout, dtype=policy)

        layer_args = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout,
                          attention_dropout=attention_dropout, ffn_dropout=ffn_dropout,
                          activation=activation, norm_first=norm_first,
                          layer_norm_epsilon=layer_norm_epsilon, dtype=policy)
        self.encoder_layers = [TransformerEncoderLayer(**layer_args, name=f"encoder_{i}")
                               for i in range(self.settings["num_encoder_layers"])]
        self.decoder_layers = [TransformerDecoderLayer(**layer_args, name=f"decoder_{i}")
                               for i in range(self.settings["num_decoder_layers"])]
        # Each stacked layer is also an attribute: tf.train.Checkpoint follows attributes but
        # not the layers inside a Keras list (Keras 3 makes lists TensorFlow dependencies only
        # for SavedModel export). The names give the checkpoint keys "encoder_layers_<i>".
        for name in ("encoder_layers", "decoder_layers"):
            for index, layer in enumerate(getattr(self, name)):
                setattr(self, f"{name}_{index}", layer)
        # Pre-norm stacks end with a LayerNorm (their last residual sum is otherwise unnormalised).
        self.encoder_norm = self.decoder_norm = None
        if norm_first:
            self.encoder_norm = LayerNorm(
                epsilon=layer_norm_epsilon, dtype=policy, name="encoder_norm")
            self.decoder_norm = LayerNorm(
                epsilon=layer_norm_epsilon, dtype=policy, name="decoder_norm")

    def build(self, input_shape=None):
        # encode()/decode() may run before __call__, so every sublayer is built here, once.
        shape = (None, None, self.d_model)
        for layer in [self.source_embedding, self.target_embedding, self.positions,
                      *self.encoder_layers, *self.decoder_layers, self.encoder_norm,
                      self.decoder_norm, self.output_projection]:
            if layer is not None and not layer.built:  # the shared embedding appears twice
                layer.build(shape)
        self.built = True

    def _embed(self, embedding, token_ids, training):
        x = self.positions(embedding(token_ids))
        return self.embedding_dropout(x, training=training)

    def encode(self, source_ids, training=None, return_attention_scores=False):
        """Runs the encoder.

        Args:
          source_ids: [B, S] int32 token ids, PAD_ID-padded.
          training: dropout on.
          return_attention_scores: also return each layer's self-attention weights.

        Returns:
          memory [B, S, D] and source_padding [B, S] (True at real tokens); with
          return_attention_scores, also a list of [B, H, S, S] per layer.
        """
        if not self.built:
            self.build()
        source_padding = tf.not_equal(source_ids, PAD_ID)
        x = self._embed(self.source_embedding, source_ids, training)
        x, weights = self._run_stack(self.encoder_layers, self.encoder_norm, x,
                                     (source_padding,), training, return_attention_scores)
        if return_attention_scores:
            return x, source_padding, weights
        return x, source_padding

    @staticmethod
    def _run_stack(layers, final_norm, x, layer_args, training, return_attention_scores):
        """x through each layer (and the pre-norm final LayerNorm); returns x and the list of
        per-layer attention weights (empty unless asked for)."""
        weights = []
        for layer in layers:
            x = layer(x, *layer_args, training=training,
                      return_attention_scores=return_attention_scores)
            if return_attention_scores:
                x, layer_weights = x
                weights.append(layer_weights)
        if final_norm is not None:
            x = final_norm(x, training=training)
        return x, weights

    def _logits(self, x):
        if self.output_projection is not None:
            # Its kernel through `linear` (one 2-D GEMM) rather than Dense's batched matmul.
            logits = linear(x, self.output_projection.kernel)
        else:
            logits = self.target_embedding.logits(x)
        return tf.cast(logits, tf.float32)  # [B, T, V]; the loss and softmax work in float32

    def _logit_slices(self, x):
        """x [B, D] -> the logits as a list of float32 [B, V_i] (`linear.linear_slices`)."""
        if self.output_projection is not None:
            slices = linear_slices(x, self.output_projection.kernel)
        else:
            slices = linear_slices(x, self.target_embedding.embeddings, transpose_kernel=True)
        return [tf.cast(part, tf.float32) for part in slices]

    def output_kernel(self):
        """The [V, D] matrix whose product with the decoder states gives the logits."""
        if self.output_projection is not None:
            return tf.transpose(self.output_projection.kernel)
        return self.target_embedding.embeddings

    def decoder_states(self, target_ids, memory, source_padding, training=None,
                       return_attention_scores=False):
        """Teacher-forced decoder output before the output projection. The training loop
        projects the states inside its loss (`losses.masked_projected_loss_sum`).

        Args:
          target_ids: [B, T] decoder input ids, starting with BOS.
          memory, source_padding: `encode`'s outputs.
          training: dropout on.
          return_attention_scores: also collect each layer's attention weights.

        Returns:
          (states [B, T, D] in the compute dtype, a list of per-layer {"self", "cross"}
          attention weights, empty unless return_attention_scores).
        """
        length = tf.shape(target_ids)[1]
        self_mask = causal_mask(length)  # [1, T, T]; padded targets are masked in the loss
        memory_mask = source_padding[:, None, :]  # [B, 1, S]
        x = self._embed(self.target_embedding, target_ids, training)
        return self._run_stack(self.decoder_layers, self.decoder_norm, x,
                               (memory, self_mask, memory_mask), training,
                               return_attention_scores)

    def decode(self, target_ids, memory, source_padding, training=None,
               return_attention_scores=False):
        """Teacher-forced decoding.

        Args:
          target_ids: [B, T] decoder input ids, starting with BOS.
          memory, source_padding: `encode`'s outputs.
          training: dropout on.
          return_attention_scores: also return each layer's attention weights.

        Returns:
          logits [B, T, V] (float32); with return_attention_scores also a list of
          {"self", "cross"} weights per layer.
        """
        x, weights = self.decoder_states(target_ids, memory, source_padding, training,
                                         return_attention_scores)
        logits = self._logits(x)
        return (logits, weights) if return_attention_scores else logits

    def initial_cache(self, memory):
        """The decoding cache that `decode_step` starts from.

        Args:
          memory: [B, S, D], `encode`'s output.

        Returns:
          One dict per decoder layer: {"self": an empty `kv_cache.AppendCache`
          [B, H, 0, Dh], "memory": the projected memory keys/values [B, H, S, Dh]}.
        """
        batch = tf.shape(memory)[0]
        layer = self.decoder_layers[0]
        heads, head_dim = layer.num_heads, self.d_model // layer.num_heads
        return [{"self": kv_cache.AppendCache.empty(batch, heads, head_dim, memory.dtype),
                 "memory": layer.memory_cache(memory)}
                for layer in self.decoder_layers]

    @contextlib.contextmanager
    def decoding_products(self):
        """A scope for a decoding loop, which prepares what its steps multiply by once per
        search (the loop takes it as loop-invariant inputs): each layer's self-attention query,
        key and value kernels side by side, for one product per step
        (`linear.concatenated_kernels`); the output layer's kernel in VOCAB_SLICES column
        blocks (`linear.sliced_kernels`; a tied embedding transposed once, not at every step),
        for a vocabulary of SLICED_VOCAB tokens or more, else whole (tied:
        `linear.pretransposed_kernels`).

        Yields:
          How many slices `decode_step(..., logit_slices=True)` returns the logits in.
        """
        attentions = [layer.self_attention for layer in self.decoder_layers]
        tied = self.output_projection is None
        kernel = self.target_embedding.embeddings if tied else self.output_projection.kernel
        slices = VOCAB_SLICES if (fast_ops.enabled() and VOCAB_SLICES > 1 and
                                  self.settings["target_vocab_size"] >= SLICED_VOCAB) else 1
        with contextlib.ExitStack() as scopes:
            scopes.enter_context(concatenated_kernels(
                [(a.projection_kernels(), a.projection_biases()) for a in attentions]))
            if slices > 1:
                scopes.enter_context(sliced_kernels([kernel], slices, transpose=tied))
            elif tied:
                scopes.enter_context(pretransposed_kernels([kernel]))
            yield slices

    def residual_dropouts(self):
        """The dropout layers whose rate is `dropout`: the embeddings' and each layer's on its
        sublayer outputs (not attention_dropout's or ffn_dropout's)."""
        return [self.embedding_dropout] + [layer.dropout for layer in
                                           self.encoder_layers + self.decoder_layers]

    def decode_step(self, token_ids, step, cache, source_padding, return_attention=False,
                    logit_slices=False):
        """One incremental decoding step: attends to the cached prefix only, so no earlier
        position is recomputed.

        Args:
          token_ids: [B, 1], the tokens at position `step`.
          step: the position (0 for BOS).
          cache: `initial_cache`'s or the previous step's cache. Its memory entries and
            source_padding [Bs, S] may hold one row per group of B / Bs consecutive token rows
            (the beams of a sentence).
          source_padding: [Bs, S], True at real source tokens.
          return_attention: also return the last layer's cross-attention.
          logit_slices: return the logits as a list of [B, V_i] slices along V, one per
            column block of the output kernel that `decoding_products` prepared (one outside
            it).

        Returns:
          (logits [B, V] float32 (or its slices), the new cache), and with return_attention
          the last layer's cross-attention averaged over heads [B, S].
        """
        memory_mask = source_padding[:, None, :]  # [Bs, 1, S]
        # The step's states are [B, D], one position per row: no op moves a length-1 axis.
        x = self.target_embedding(tf.reshape(token_ids, [-1]))  # [B, D]
        x = x + tf.cast(self.positions.at(step), x.dtype)
        new_cache = []
        last = len(self.decoder_layers) - 1
        for index, (layer, layer_cache) in enumerate(zip(self.decoder_layers, cache)):
            # The single query may attend to every cached position: no causal mask needed.
            x, layer_cache, weights = layer.call_cached(
                x, layer_cache, memory_mask,
                return_attention_scores=return_attention and index == last)
            new_cache.append(layer_cache)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        logits = self._logit_slices(x) if logit_slices else self._logits(x)  # [B, V]
        if return_attention:
            return logits, new_cache, tf.reduce_mean(weights["cross"][:, :, 0], axis=1)
        return logits, new_cache

    def call(self, inputs, training=None):
        """Teacher forcing: inputs = (source_ids [B, S], target_input_ids [B, T]) -> logits
        [B, T, V] (float32)."""
        source_ids, target_ids = inputs
        memory, source_padding = self.encode(source_ids, training=training)
        return self.decode(target_ids, memory, source_padding, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(self.settings)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)
