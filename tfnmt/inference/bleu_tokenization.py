"""The sacreBLEU tokenization that BLEU splits a target language into words with.

sacreBLEU's default, 13a, splits words at spaces and punctuation. Chinese, Japanese, Thai and
other scripts put no spaces between words: under 13a a whole sentence is one or two words,
and a good translation scores BLEU near 0, so such a dev BLEU can neither keep the best
checkpoint nor choose the length penalty. sacreBLEU's own choice for a Chinese target
(`sacrebleu -l en-zh`) is its zh tokenization, which splits off each Chinese character.

`auto`, the default of train.py's and evaluate.py's `--bleu_tokenize`, reads the script of the
references' letters (`detect`):

    most letters Han characters, few kana (Chinese)       zh
    most letters Han characters and kana (Japanese)       char
    most letters Thai, Lao, Khmer, Myanmar or Tibetan     char
    anything else (Korean too: its words are spaced)      13a

For Japanese and Korean, sacreBLEU's usual choices are ja-mecab and ko-mecab, which need
packages tfnmt does not install (`pip install "sacrebleu[ja]"` or `"sacrebleu[ko]"`): give them
as `--bleu_tokenize`. The tokenization a score used is in its signature (`tok:zh`).
"""
import itertools

AUTO = "auto"
# sacreBLEU's tokenizations that need no download (its spm and flores ones fetch a model).
TOKENIZATIONS = ("13a", "intl", "zh", "char", "ja-mecab", "ko-mecab", "none")
CHOICES = (AUTO,) + TOKENIZATIONS
# Those that split text without spaces into characters or words: TER then normalizes with
# sacreBLEU's Asian-script support, which splits Han characters and kana (not Thai) apart,
# else it would count such a sentence as one word.
UNSPACED = ("zh", "char", "ja-mecab")

# Letters counted: those of the first references are enough to tell the script.
SAMPLE_SENTENCES = 1000
# Share of the letters a script needs to decide the tokenization.
MAJORITY = 0.5
# Share of kana among Han characters and kana above which text is Japanese.
JAPANESE_KANA = 0.1

_HAN = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3134F))
_KANA = ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9F))
_UNSPACED = ((0x0E00, 0x0EFF),  # Thai, Lao
             (0x0F00, 0x0FFF),  # Tibetan
             (0x1000, 0x109F),  # Myanmar
             (0x1780, 0x17FF))  # Khmer


def _in(ranges, code):
    return any(low <= code <= high for low, high in ranges)


def _script(char):
    code = ord(char)
    if _in(_HAN, code):
        return "han"
    if _in(_KANA, code):
        return "kana"
    if _in(_UNSPACED, code):
        return "unspaced"
    return "other"


def detect(references):
    """The tokenization `auto` stands for, from the script of the references' letters.

    Args:
      references: target-language sentences (str); the first SAMPLE_SENTENCES are read.

    Returns:
      (tokenization, why): a name of TOKENIZATIONS, and a phrase saying what decided it
      ("" for 13a).
    """
    counts = {"han": 0, "kana": 0, "unspaced": 0, "other": 0}
    for sentence in itertools.islice(references, SAMPLE_SENTENCES):
        for char in sentence:
            if char.isalpha():
                counts[_script(char)] += 1
    letters = sum(counts.values())
    cjk = counts["han"] + counts["kana"]
    if letters and cjk >= MAJORITY * letters:
        if counts["kana"] > JAPANESE_KANA * cjk:
            return "char", (f"the references are Japanese ({cjk / letters:.0%} of their letters "
                            "Han characters and kana), scored on characters; sacreBLEU's "
                            "ja-mecab needs `pip install \"sacrebleu[ja]\"` and "
                            "--bleu_tokenize=ja-mecab")
        return "zh", (f"the references are Chinese ({cjk / letters:.0%} of their letters Han "
                      "characters), scored a word per character as sacreBLEU does Chinese")
    if letters and counts["unspaced"] >= MAJORITY * letters:
        return "char", (f"the references are written without spaces "
                        f"({counts['unspaced'] / letters:.0%} of their letters Thai, Lao, Khmer, "
                        "Myanmar or Tibetan), scored on characters")
    return "13a", ""


def resolve(tokenization, references):
    """`tokenization` itself, or for `auto` the one `detect` finds in the references.

    Returns:
      (tokenization, why): why is "" unless `auto` chose something other than 13a.
    """
    if tokenization == AUTO:
        return detect(references)
    return tokenization, ""


def check_available(tokenization):
    """Raises ValueError (in one line) when sacreBLEU cannot tokenize this way here: ja-mecab
    and ko-mecab need packages of their own."""
    if tokenization == AUTO:
        return
    if tokenization not in TOKENIZATIONS:
        raise ValueError(f"--bleu_tokenize={tokenization}: one of {', '.join(CHOICES)}")
    import sacrebleu

    try:
        sacrebleu.metrics.BLEU(tokenize=tokenization)
    except (RuntimeError, ImportError):  # what sacreBLEU raises for missing extras
        language = "ja" if tokenization == "ja-mecab" else "ko"
        raise ValueError(f"--bleu_tokenize={tokenization} needs sacreBLEU's extra packages: "
                         f"pip install \"sacrebleu[{language}]\"") from None
