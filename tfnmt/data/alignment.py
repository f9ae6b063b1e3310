"""Two line-aligned files that have gone out of step (a line missing or extra in one of them,
so that every pair after it joins a sentence to its neighbour's translation): told from the
lengths of the lines. A sentence's length and its translation's go together (their logarithms
correlate 0.69-0.95 in each window of 1,000 pairs of the embedded corpus); a sentence and the
translation of a line next to it 0.07-0.47 in the windows tried. Where, over a window of pairs,
the source's lengths follow the target's a few lines further on (or back) far better than those
of its own line, the files are out of step there, and `corpus.read_aligned` stops with the line
numbers instead of training on mismatched pairs.
"""
import math

import numpy as np

WINDOW = 1000  # pairs judged at once
STRIDE = 250  # a window starts every STRIDE pairs
# When the files end, a window starts every END_STRIDE pairs from the last one judged on, so
# that a slip in the last lines has a window that starts just after it.
END_STRIDE = 10
MIN_WINDOW = 200  # a last, shorter window of fewer pairs is not judged
SHIFTS = (-3, -2, -1, 1, 2, 3)  # lines a side may have slipped by
# A shifted pairing must correlate at least this well, and this much better than the given one.
SHIFTED_CORRELATION = 0.5
MARGIN = 0.3


def _correlation(a, b):
    if a.std() < 1e-6 or b.std() < 1e-6:  # one length throughout: nothing to go by
        return None
    return float(np.corrcoef(a, b)[0, 1])


def out_of_step(source_lengths, target_lengths):
    """How a window of pairs looks out of step, or None.

    Args:
      source_lengths, target_lengths: the characters of each pair's two lines.

    Returns:
      None, or {"shift": k (source line i goes with target line i + k), "given": correlation
      of the lines as paired, "shifted": correlation with the shift}.
    """
    source = np.log1p(np.asarray(source_lengths, np.float64))
    target = np.log1p(np.asarray(target_lengths, np.float64))
    given = _correlation(source, target)
    if given is None:
        return None
    best = None
    for shift in SHIFTS:
        if shift > 0:
            shifted = _correlation(source[:-shift], target[shift:])
        else:
            shifted = _correlation(source[-shift:], target[:shift])
        if shifted is not None and (best is None or shifted > best["shifted"]):
            best = {"shift": shift, "given": given, "shifted": shifted}
    if best and best["shifted"] >= SHIFTED_CORRELATION and best["shifted"] - given >= MARGIN:
        return best
    return None


def change_point(source_lengths, target_lengths, shift):
    """Where pairs that start in step go out of step by `shift` lines: the index b that best
    splits them into pairs in step (before b) and pairs shifted (from b on), by the squared
    differences of the two sides' standardized log lengths (a least-squares change point).
    Within 8 lines of the slip on the embedded corpus' lines (18 slips tried)."""
    source = np.log1p(np.asarray(source_lengths, np.float64))
    target = np.log1p(np.asarray(target_lengths, np.float64))
    source, target = ((side - side.mean()) / max(side.std(), 1e-6) for side in (source, target))
    lines = np.arange(max(0, -shift), len(source) - max(0, shift))
    in_step = (source[lines] - target[lines]) ** 2
    shifted = (source[lines] - target[lines + shift]) ** 2
    in_step_before = np.concatenate([[0.0], np.cumsum(in_step)])
    shifted_before = np.concatenate([[0.0], np.cumsum(shifted)])
    cost = in_step_before + (shifted_before[-1] - shifted_before)  # [j]: j lines in step
    return int(lines[0] + np.argmin(cost))


class AlignmentWatch:
    """Judges the pairs of two line-aligned files window by window as they are read.

    A window of WINDOW pairs starts every STRIDE pairs, so that a slip has a window that starts
    just after it, all of whose pairs are out of step (a window the slip cuts in two may pass).
    When the files end, windows of up to WINDOW pairs that start every END_STRIDE pairs after
    the last one judged are judged, each that holds MIN_WINDOW pairs: a slip more than
    MIN_WINDOW + END_STRIDE lines before the end has one that starts just after it.

    Example:
      watch = AlignmentWatch()
      for number, (source, target) in enumerate(pairs, 1):
          if (found := watch.add(number, source, target)):
              ...  # {"first", "last", "shift", "given", "shifted", "at"}
      found = watch.finish()
    """

    def __init__(self):
        self._sources, self._targets = [], []  # lengths of the pairs read from index _kept on
        self._first, self._count, self._kept = None, 0, 0  # pair number of index 0; indices

    def add(self, number, source, target):
        """Notes pair `number` (1-based, one after the other); when a window fills it is
        judged: -> `_judge`'s result."""
        if self._first is None:
            self._first = number
        self._sources.append(len(source))
        self._targets.append(len(target))
        self._count += 1
        start = self._count - WINDOW
        if start < 0 or start % STRIDE:
            return None
        found = self._judge(start, self._count)
        # Kept: the pairs of the windows `finish` may still judge.
        drop = start + END_STRIDE - self._kept
        del self._sources[:drop], self._targets[:drop]
        self._kept += drop
        return found

    def finish(self):
        """Judges the windows that start every END_STRIDE pairs after the last full one
        judged (at the first pair if none was), each of up to WINDOW pairs that holds MIN_WINDOW
        pairs or more: the first out of step, or None."""
        for start in range(self._kept, self._count - MIN_WINDOW + 1, END_STRIDE):
            if found := self._judge(start, min(start + WINDOW, self._count)):
                return found
        return None

    def _judge(self, start, end):
        """The window of pairs [start, end) (indices), out of step: `out_of_step`'s result
        with "first" and "last" (pair numbers) and "at" (where in it the slip looks to be: the
        windows before it, which would hold a slip before it, were judged in step), else
        None."""
        sources = self._sources[start - self._kept:end - self._kept]
        targets = self._targets[start - self._kept:end - self._kept]
        found = out_of_step(sources, targets)
        if found is None or math.isnan(found["given"]):
            return None
        return dict(found, first=self._first + start, last=self._first + end - 1,
                    at=self._first + start + change_point(sources, targets, found["shift"]))


def first_out_of_step(pairs):
    """The first window of `pairs` ((first, second) strings, all of them) that looks out of
    step (`AlignmentWatch`), or None."""
    watch = AlignmentWatch()
    for number, (first, second) in enumerate(pairs, 1):
        if found := watch.add(number, first, second):
            return found
    return watch.finish()


def describe(found, sides=("source", "target")):
    """A window found out of step, in words; `sides` name the two files' lines."""
    lines = abs(found["shift"])
    where = f"{lines} line{'s' if lines > 1 else ''} {'before' if found['shift'] < 0 else 'after'}"
    return (f"the lines go out of step at about line {found['at']:,d}: a line is missing from "
            f"one file or extra in the other there (in lines {found['first']:,d}-"
            f"{found['last']:,d}, the lengths of the {sides[0]} lines follow those of the "
            f"{sides[1]} lines {where} them, correlation {found['shifted']:.2f}, rather than "
            f"their own, {found['given']:.2f})")
