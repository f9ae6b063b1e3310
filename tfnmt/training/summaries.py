"""TensorBoard pictures (attention weights as heatmaps, heads side by side) and the RSS gauge."""
import numpy as np
import tensorflow as tf


def heads_side_by_side(weights, pixel=4, gap=2):
    """An attention picture: a white-to-dark-blue heatmap per head, query positions down, key
    positions across.

    Args:
      weights: [H, Tq, Tk] in [0, 1].
      pixel: the side of one weight's square, in pixels.
      gap: pixels between heads.

    Returns:
      [Tq * pixel, H * (Tk * pixel + gap) - gap, 3] uint8 RGB.
    """
    weights = np.asarray(weights, np.float32)
    heads, rows, cols = weights.shape
    # Each head scaled to its own maximum so that diffuse heads stay visible.
    scaled = weights / np.maximum(weights.max(axis=(1, 2), keepdims=True), 1e-9)
    tiles = []
    for head in scaled:
        big = np.kron(head, np.ones((pixel, pixel), np.float32))  # [Tq*p, Tk*p]
        rgb = np.stack([1.0 - 0.9 * big, 1.0 - 0.7 * big, 1.0 - 0.3 * big], axis=-1)
        tiles.append(rgb)
        tiles.append(np.ones((rows * pixel, gap, 3), np.float32))
    return (np.concatenate(tiles[:-1], axis=1) * 255).astype(np.uint8)


def attention_weights(model, source_ids, target_in):
    """Every layer's attention of one sentence pair, teacher-forced.

    Args:
      model: a `Transformer`.
      source_ids: [1, S].
      target_in: [1, T], starting with BOS.

    Returns:
      {name: [H, Tq, Tk]} for the encoder self, decoder self and decoder cross attention of
      each layer.
    """
    memory, padding, encoder = model.encode(source_ids, training=False,
                                            return_attention_scores=True)
    _, decoder = model.decode(target_in, memory, padding, training=False,
                              return_attention_scores=True)
    maps = {}
    for i, w in enumerate(encoder):
        maps[f"encoder_self/layer_{i}"] = w[0].numpy()
    for i, w in enumerate(decoder):
        maps[f"decoder_self/layer_{i}"] = w["self"][0].numpy()
        maps[f"decoder_cross/layer_{i}"] = w["cross"][0].numpy()
    return maps


def write_attention_images(model, source_ids, target_in, step):
    """Writes one image summary per layer and attention kind (call inside a summary writer).

    Args:
      model, source_ids, target_in: as for `attention_weights`.
      step: the summary step.
    """
    for name, weights in attention_weights(model, source_ids, target_in).items():
        image = heads_side_by_side(weights)[None]
        tf.summary.image(f"attention/{name}", image, step=step,
                         description="heads side by side; rows: queries, columns: keys")


def rss_bytes():
    """Resident set size of this process (0 where /proc is not available)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
