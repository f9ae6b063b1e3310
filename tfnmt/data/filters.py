"""Training-pair filters applied when the train split is prepared, each counted: pairs whose
subword lengths differ too much (misaligned or truncated lines), exact duplicates, and pairs
whose source is their target (untranslated copies, common in crawled data)."""
import hashlib


class PairFilter:
    """Decides which training pairs to keep, and counts those it drops.

    Args:
      max_length_ratio: drop a pair whose longer side has more than this many times the
        subwords of its shorter side (0: keep all).
      duplicates: drop a pair seen before (the same source and target, in any corpus).
      identical: drop a pair whose source and target are the same text.

    Example:
      pair_filter = PairFilter(max_length_ratio=3.0, duplicates=True, identical=True)
      if pair_filter.keep_text(source, target) and pair_filter.keep_ids(source_ids, target_ids):
          ...
      pair_filter.dropped  # {"length_ratio": 12, "duplicates": 40, "identical": 3}
    """

    def __init__(self, max_length_ratio=0.0, duplicates=False, identical=False):
        if max_length_ratio and max_length_ratio < 1.0:
            raise ValueError(f"max_length_ratio must be 0 (off) or >= 1, got {max_length_ratio}")
        self.max_length_ratio = float(max_length_ratio or 0.0)
        self.duplicates, self.identical = bool(duplicates), bool(identical)
        self.dropped = {"length_ratio": 0, "duplicates": 0, "identical": 0}
        self._seen = set()

    @property
    def settings(self):
        """The filters that are on, as a JSON-able dict ({} when none is)."""
        on = {"max_length_ratio": self.max_length_ratio, "duplicates": self.duplicates,
              "identical": self.identical}
        return {k: v for k, v in on.items() if v}

    def keep_text(self, source, target):
        """Whether a pair passes the text filters (identical, duplicates).

        Args:
          source, target: the pair's text.

        Returns:
          True to keep it.
        """
        if self.identical and source == target:
            self.dropped["identical"] += 1
            return False
        if self.duplicates:
            # The source's length first: a side may hold a tab (two-file corpora), so no
            # separator between the two would tell ("a\tb", "c") from ("a", "b\tc").
            source_bytes = source.encode()
            digest = hashlib.blake2b(len(source_bytes).to_bytes(8, "little") + source_bytes
                                     + target.encode(), digest_size=16).digest()
            if digest in self._seen:
                self.dropped["duplicates"] += 1
                return False
            self._seen.add(digest)
        return True

    def keep_ids(self, source_ids, target_ids):
        """Whether a tokenized pair passes the length-ratio filter.

        Args:
          source_ids, target_ids: the pair's subword ids.

        Returns:
          True to keep it.
        """
        if self.max_length_ratio:
            short, long = sorted((max(len(source_ids), 1), max(len(target_ids), 1)))
            if long > self.max_length_ratio * short:
                self.dropped["length_ratio"] += 1
                return False
        return True


class HeldOutOverlap:
    """Counts the dev and test pairs that the training data holds too (the same source and
    target, after stripping): a held-out split taken from the training corpus, or the same file
    given for both, scores what the model remembers, not how it translates.

    Args:
      held_out: {split: its (source, target) pairs}.

    Example:
      overlap = HeldOutOverlap({"dev": dev_pairs})
      for pair in overlap.passing(train_pairs):
          ...
      overlap.counts()  # {"dev": {"pairs": 200, "in_train": 200}}
    """

    def __init__(self, held_out):
        self.held_out = {split: list(pairs) for split, pairs in held_out.items()}
        self._wanted = set().union(*self.held_out.values())
        self._found = set()

    def passing(self, pairs):
        """Yields `pairs` unchanged, noting each held-out pair among them."""
        for pair in pairs:
            if pair in self._wanted:
                self._found.add(pair)
            yield pair

    def counts(self):
        """{split: {"pairs": its pairs, "in_train": how many of them the pairs passed hold}}."""
        return {split: {"pairs": len(pairs),
                        "in_train": sum(pair in self._found for pair in pairs)}
                for split, pairs in self.held_out.items()}
