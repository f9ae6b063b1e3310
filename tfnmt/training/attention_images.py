"""Attention pictures for TensorBoard: one heatmap per head, side by side, with the tokens on
the axes (Pillow, which TensorBoard itself installs, draws the text)."""
import numpy as np
from PIL import Image, ImageDraw, ImageFont

SEPARATOR = (96, 96, 96)  # the line between heads
TEXT = (0, 0, 0)
MAX_LABEL = 12  # characters of a token shown


def heat_colors(weights):
    """White (0) to dark blue (1): [...] in [0, 1] -> [..., 3] uint8."""
    w = np.clip(np.asarray(weights, np.float32), 0.0, 1.0)[..., None]
    return np.round(255 * (1.0 - w * np.array([0.9, 0.7, 0.3], np.float32))).astype(np.uint8)


def _label(token):
    token = token.replace("\u2581", "_")  # SentencePiece's word start, visible in any font
    return token if len(token) <= MAX_LABEL else token[:MAX_LABEL - 1] + "~"


def labelled_heads(weights, query_tokens, key_tokens, cell=14, gap=3):
    """An attention picture: per head a heatmap of the weights (each head scaled to its own
    maximum, so diffuse heads stay visible), query tokens down the left, key tokens written
    upwards above each head, "head i" under each, heads parted by a grey line.

    Args:
      weights: [H, Tq, Tk] in [0, 1].
      query_tokens: Tq strings (rows).
      key_tokens: Tk strings (columns).
      cell: the side of one weight's square, in pixels.
      gap: pixels between heads (the middle one is the grey line).

    Returns:
      [height, width, 3] uint8 RGB.

    Example:
      image = labelled_heads(w, ["<s>", "_The", "_house"], ["_Das", "_Haus", "</s>"])
      tf.summary.image("samples/attention/decoder_cross/layer_0", image[None], step=step)
    """
    weights = np.asarray(weights, np.float32)
    heads, rows, cols = weights.shape
    if (rows, cols) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"weights of {rows} x {cols} positions for {len(query_tokens)} query "
                         f"and {len(key_tokens)} key tokens")
    font = ImageFont.load_default(size=max(cell - 3, 8))
    queries, keys = [_label(t) for t in query_tokens], [_label(t) for t in key_tokens]
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))

    def text_width(text):
        return int(np.ceil(measure.textlength(text, font=font))) if text else 0

    left = max([text_width(t) for t in queries] + [0]) + 4
    top = max([text_width(t) for t in keys] + [0]) + 4
    bottom = cell + 4
    head_width = cols * cell
    width = left + heads * head_width + (heads - 1) * gap
    height = top + rows * cell + bottom
    pixels = np.full((height, width, 3), 255, np.uint8)
    scaled = weights / np.maximum(weights.max(axis=(1, 2), keepdims=True), 1e-9)
    for h in range(heads):
        x = left + h * (head_width + gap)
        block = np.kron(scaled[h], np.ones((cell, cell), np.float32))  # [Tq*cell, Tk*cell]
        pixels[top:top + rows * cell, x:x + head_width] = heat_colors(block)
        if h:
            pixels[:, x - gap + gap // 2] = SEPARATOR
    image = Image.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    for i, token in enumerate(queries):
        draw.text((left - 2, top + i * cell + cell // 2), token, fill=TEXT, font=font,
                  anchor="rm")
    for h in range(heads):
        x = left + h * (head_width + gap)
        for j, token in enumerate(keys):
            if not token:
                continue
            # Written horizontally, then turned a quarter to read upwards.
            label = Image.new("RGB", (text_width(token), cell), "white")
            ImageDraw.Draw(label).text((0, cell // 2), token, fill=TEXT, font=font, anchor="lm")
            label = label.rotate(90, expand=True)
            image.paste(label, (x + j * cell, top - 2 - label.height))
        draw.text((x + head_width // 2, top + rows * cell + 2), f"head {h}", fill=TEXT,
                  font=font, anchor="mt")
    return np.asarray(image)
