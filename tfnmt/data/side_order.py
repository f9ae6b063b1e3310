"""Whether a dev or test corpus holds its pairs the other way round from the training corpus
(`--dev_files=dev.en,dev.de` beside `--train_files=train.de,train.en`): judged by how often
pairs of adjacent characters occur in each side of the training text, which tells languages
apart without a model of either (as character n-gram language identification does). A dev set
given the other way round scores near zero BLEU at every evaluation, and the best checkpoint and
the length penalty are chosen by noise.

Read before TensorFlow loads: plain Python over a sample of each corpus.
"""
import collections
import math

# The other way round must fit this many nats per character pair better than the way given:
# the embedded corpus's German-English dev and test sets fit their own way 0.83-0.96 better
# (1,000 training pairs against 5 to 1,000 of theirs), 100 pairs of one short template 0.57,
# text of one language on both sides (a paraphrase corpus) 0.
SWAPPED_MARGIN = 0.25
# Fewer character pairs than this in a sample say too little to judge by.
MIN_CHARACTER_PAIRS = 200


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
