"""Whether a dev or test corpus holds its pairs the other way round from the training corpus
(`--dev_files=dev.en,dev.de` beside `--train_files=train.de,train.en`): judged by how often
pairs of adjacent characters occur in each side of the training text, which tells languages
apart without a model of either (as character n-gram language identification does). A dev set
given the other way round scores near zero BLEU at every evaluation, and the best checkpoint and
the length penalty are chosen by noise.

A trained model keeps these counts of its training text (`PROFILE_FILE`, in its model_dir and
in its exports' assets.extra), so that translate.py and evaluate.py can tell input written in
the model's target language (`reads_like_other_side`): it is translated into nonsense.

Read before TensorFlow loads: plain Python over a sample of each corpus.
"""
import collections
import itertools
import json
import math
import os

from tfnmt.paths import write_atomically

# The other way round must fit this many nats per character pair better than the way given:
# the embedded corpus's German-English dev and test sets fit their own way 0.83-0.96 better
# (1,000 training pairs against 5 to 1,000 of theirs), 100 pairs of one short template 0.57,
# text of one language on both sides (a paraphrase corpus) 0.
SWAPPED_MARGIN = 0.25
# Fewer character pairs than this in a sample say too little to judge by.
MIN_CHARACTER_PAIRS = 200
# Text must fit the other training side's character pairs this many nats per pair better than
# its own side's to be called the other language. Measured on the embedded corpus (sides of its
# first 1,000 training pairs; 30 draws each of 3 to 1,000 test sentences): German fits the
# German side 0.61 or more better than the English one, English the English side 0.59 or more.
OTHER_LANGUAGE_MARGIN = 0.3
# The character pairs of a training run's first pairs, in its model_dir: {"source": {pair:
# count}, "target": {pair: count}}.
PROFILE_FILE = "character_pairs.json"


def character_pairs(texts):
    """Counts of adjacent-character pairs in `texts`, lowercased, a space at either end."""
    counts = collections.Counter()
    for text in texts:
        text = f" {text.lower()} "
        counts.update(text[i:i + 2] for i in range(len(text) - 1))
    return counts


class _SideModel:
    """Add-one smoothed character-pair frequencies of one side of the training text."""

    def __init__(self, counts, distinct):
        self.counts, self.total, self.distinct = counts, sum(counts.values()), distinct

    def mean_log_probability(self, counts):
        """Nats per character pair of text with these `character_pairs` counts."""
        log_total = math.log(self.total + self.distinct)
        return sum(count * (math.log(self.counts.get(pair, 0) + 1) - log_total)
                   for pair, count in counts.items()) / sum(counts.values())


def swapped_sides(train_pairs, pairs):
    """Whether `pairs` (a dev or test sample) look given the other way round from `train_pairs`
    (a training sample): their sources fit the training targets' character-pair frequencies and
    their targets the training sources', by SWAPPED_MARGIN nats per pair or more.

    Args:
      train_pairs, pairs: (source, target) strings.

    Returns:
      None, or the evidence: {"as_given": nats per pair, "swapped": nats per pair} (the mean
      over both sides of the log-probability under the training side each is matched with).
    """
    if not train_pairs or not pairs:
        return None
    train_sides = [character_pairs(side) for side in zip(*train_pairs)]
    sides = [character_pairs(side) for side in zip(*pairs)]
    if min(sum(c.values()) for c in train_sides + sides) < MIN_CHARACTER_PAIRS:
        return None
    distinct = len(set(train_sides[0]) | set(train_sides[1]) | set(sides[0]) | set(sides[1]))
    source_model, target_model = (_SideModel(counts, distinct) for counts in train_sides)
    as_given = (source_model.mean_log_probability(sides[0])
                + target_model.mean_log_probability(sides[1])) / 2
    swapped = (target_model.mean_log_probability(sides[0])
               + source_model.mean_log_probability(sides[1])) / 2
    if swapped - as_given >= SWAPPED_MARGIN:
        return {"as_given": as_given, "swapped": swapped}
    return None


def training_pairs(settings, sample=1000):
    """The first `sample` training pairs of a run (its settings.json), or None where they do
    not read here (a corpus moved or gone, a TFDS dataset not prepared on this machine)."""
    from tfnmt.data import corpus

    d = settings.get("data") or {}
    try:
        return list(itertools.islice(corpus.read_corpus(
            d["dataset"], "train", (d.get("files") or {}).get("train"), d.get("tfds_data_dir"),
            log_skipped=False, reverse=d.get("reverse", False), download=False), sample))
    except (corpus.CorpusError, KeyError, OSError):
        return None


def model_profiles(model_dir):
    """A model_dir's profiles: its `PROFILE_FILE`, else (a model trained before train.py kept
    one) counted from the training files its settings.json names, else None (a TFDS dataset
    takes seconds to open: export.py counts and keeps its profiles once)."""
    from tfnmt.paths import DamagedFileError, read_settings

    profiles = read_profiles(os.path.join(model_dir, PROFILE_FILE))
    if profiles is not None:
        return profiles
    try:
        settings = read_settings(model_dir)
    except (DamagedFileError, OSError):
        return None
    files = ((settings or {}).get("data") or {}).get("dataset") == "files"
    pairs = training_pairs(settings) if files else None
    return {side: collections.Counter(counts) for side, counts in
            side_profiles(pairs).items()} if pairs else None


def keep_profiles(model_dir, settings, sample=1000):
    """Writes a model_dir's `PROFILE_FILE` from the first `sample` training pairs its settings
    name, unless it exists or they do not read here (`training_pairs`).

    Returns:
      The file's path, or None where there is none (also where it cannot be written: a
      read-only model_dir, a full disk; the record is optional).
    """
    path = os.path.join(model_dir, PROFILE_FILE)
    if not os.path.isfile(path) and (pairs := training_pairs(settings or {}, sample)):
        try:
            write_profiles(path, pairs)
        except OSError:
            pass
    return path if os.path.isfile(path) else None


def side_profiles(pairs):
    """The `PROFILE_FILE` contents of (source, target) training pairs."""
    sources, targets = zip(*pairs) if pairs else ((), ())
    return {"source": dict(character_pairs(sources)), "target": dict(character_pairs(targets))}


def write_profiles(path, pairs):
    """Writes `side_profiles(pairs)` to `path` (a temporary file renamed: all of it or none)."""
    write_atomically(path, json.dumps(side_profiles(pairs), ensure_ascii=False,
                                      separators=(",", ":")))


def read_profiles(path):
    """The profiles written at `path`, or None where it is missing or does not read (the check
    it serves is skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            profiles = json.load(f)
        return {side: collections.Counter({str(k): int(v) for k, v in profiles[side].items()})
                for side in ("source", "target")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def reads_like_other_side(profiles, texts, side="source"):
    """Whether `texts`, given as the model's `side`, look written in the other side's language:
    they fit the other training side's character-pair frequencies by OTHER_LANGUAGE_MARGIN
    nats per pair or more better than this side's (input in the target language, references in
    the source).

    Args:
      profiles: `read_profiles`' value.
      texts: sentences given as `side`.
      side: "source" or "target".

    Returns:
      None, or the evidence {"source": nats per pair, "target": nats per pair} (the mean
      log-probability of a character pair of `texts` under each training side).
    """
    counts = character_pairs(texts)
    if not profiles or sum(counts.values()) < MIN_CHARACTER_PAIRS or \
            min(sum(c.values()) for c in profiles.values()) < MIN_CHARACTER_PAIRS:
        return None
    distinct = len(set(profiles["source"]) | set(profiles["target"]) | set(counts))
    fit = {name: _SideModel(profiles[name], distinct).mean_log_probability(counts)
           for name in ("source", "target")}
    other = "target" if side == "source" else "source"
    return fit if fit[other] - fit[side] >= OTHER_LANGUAGE_MARGIN else None
