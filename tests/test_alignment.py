"""Two line-aligned files out of step (alignment.py, corpus.read_aligned), judged against
Pearson correlations summed by hand in float64."""
import math

import numpy as np
import pytest

from tfnmt.data import alignment
from tfnmt.data.corpus import CorpusError, read_aligned


def pearson(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return cov / math.sqrt(sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys))


@pytest.fixture(scope="module")
def sides(small_corpus):
    with open(small_corpus["train"], encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t")[:2] for line in f]
    return [s for s, _ in pairs], [t for _, t in pairs]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_a_window_out_of_step_is_found_with_its_shift(sides):
    source, target = (side[:1000] for side in sides)
    assert alignment.out_of_step([len(s) for s in source], [len(t) for t in target]) is None
    # The target one line ahead (a line of it lost): source line i goes with target line i - 1.
    ahead = target[1:] + ["The end."]
    found = alignment.out_of_step([len(s) for s in source], [len(t) for t in ahead])
    logs = [math.log1p(len(s)) for s in source], [math.log1p(len(t)) for t in ahead]
    assert found == {"shift": -1, "given": pytest.approx(pearson(*logs), abs=1e-9),
                     "shifted": pytest.approx(pearson(logs[0][1:], logs[1][:-1]), abs=1e-9)}
    assert found["shifted"] > 0.8 > 0.3 > found["given"]


def test_lengths_that_go_together_anyway_are_not_taken_for_out_of_step():
    # One short template (lengths set by a number's digits), the same pairs sorted by length,
    # and one length throughout: neighbours look alike, but not better than the pairs as given.
    template = [(f"Zimmer {n} ist frei.", f"Room {n} is free.") for n in range(1000)]
    by_length = sorted(template, key=lambda pair: len(pair[0]))
    for pairs in (template, by_length, [("Ja.", "Yes.")] * 1000):
        lengths = [len(s) for s, _ in pairs], [len(t) for _, t in pairs]
        assert alignment.out_of_step(*lengths) is None


@pytest.mark.parametrize("case, shift", [("target line lost", -1), ("source line added", -1),
                                         ("target line added", 1)])
def test_read_aligned_stops_where_the_files_go_out_of_step(sides, tmp_path, case, shift):
    source, target = list(sides[0]), list(sides[1])
    if case == "target line lost":
        target = target[:1500] + target[1501:] + ["The end."]
    elif case == "source line added":
        source = source[:1500] + ["Ein Satz mehr."] + source[1500:-1]
    else:
        target = target[:1500] + ["One sentence more."] + target[1500:-1]
    src, tgt = write_lines(tmp_path / "a.de", source), write_lines(tmp_path / "a.en", target)
    read = []
    with pytest.raises(CorpusError) as error:
        for pair in read_aligned(src, tgt):
            read.append(pair)
    # Windows start every 250 lines: those that the slip (at line 1,501) cuts near their
    # start or middle pass; lines 1,251-2,250, three quarters out of step, are the first
    # judged out of step, when line 2,250 is read; the slip is placed within them.
    assert len(read) == 2249
    message = str(error.value)
    at = int(message.split("at about line ")[1].split(":")[0].replace(",", ""))
    assert abs(at - 1501) <= 10
    assert message == (
        f"{src},{tgt}: the lines go out of step at about line {at:,d}: a line is missing from "
        "one file or extra in the other there (in lines 1,251-2,250, the lengths of the source "
        f"lines follow those of the target lines 1 line {'before' if shift < 0 else 'after'} "
        f"them, correlation {message.split('correlation ')[1].split(',')[0]}, rather than their "
        f"own, {message.split('rather than their own, ')[1]}")
    # In step, the same files read through.
    assert len(list(read_aligned(write_lines(tmp_path / "b.de", sides[0]),
                                 write_lines(tmp_path / "b.en", sides[1])))) == 3000


def test_evaluate_py_refuses_hypotheses_out_of_step_with_their_references(sides, tmp_path):
    # A translation file that lost a line (and so had one added at its end to keep the count):
    # refused in one line before TensorFlow loads, instead of scoring every later line against
    # its neighbour's reference.
    from helpers import imported_modules, python

    references = write_lines(tmp_path / "ref.en", sides[1])
    hypotheses = write_lines(tmp_path / "hyp.en", sides[1][:1500] + sides[1][1501:] + ["End."])
    result = python("evaluate.py", f"--hypotheses={hypotheses}", f"--reference={references}",
                    timeout=60, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("evaluate.py: --hypotheses and --reference: the lines go out of "
                           "step at about line 1,501: a line is missing from one file or extra "
                           "in the other there (in lines 1,251-2,250, the lengths of the "
                           "--hypotheses lines follow those of the --reference lines 1 line "
                           "after them")
    assert "tensorflow" not in imported_modules(result.stderr)
    scored = python("evaluate.py", f"--hypotheses={references}", f"--reference={references}",
                    "--json", timeout=120, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert scored.returncode == 0 and '"bleu": 100.0' in scored.stdout
    assert "tensorflow" not in imported_modules(scored.stderr)


def test_translate_py_refuses_translations_to_score_out_of_step(sides, tmp_path):
    from helpers import imported_modules, python

    sources = write_lines(tmp_path / "in.de", sides[0])
    targets = write_lines(tmp_path / "out.en", ["Start."] + sides[1][:-1])  # one line added
    result = python("translate.py", f"--model_dir={tmp_path / 'run'}", f"--input={sources}",
                    f"--score_targets={targets}", timeout=60,
                    env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "translate.py: --input and --score_targets: the lines go out of step at about line 1: a "
        "line is missing from one file or extra in the other there (in lines 1-1,000, the "
        "lengths of the --input lines follow those of the --score_targets lines 1 line after "
        "them")
    assert "tensorflow" not in imported_modules(result.stderr)


def test_the_slip_is_placed_where_the_least_squares_split_puts_it(sides):
    # Against every split point tried by hand in float64, and near the slip itself.
    source, target = sides[0][:600], sides[1][:234] + sides[1][235:601]  # target line lost
    lengths = [len(s) for s in source], [len(t) for t in target]
    z = []
    for side in lengths:
        logs = [math.log1p(n) for n in side]
        mean = sum(logs) / len(logs)
        deviation = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
        z.append([(x - mean) / deviation for x in logs])
    lines = range(1, 600)  # shift -1: source line i against target line i - 1 from the split

    def cost(split):
        return (sum((z[0][i] - z[1][i]) ** 2 for i in lines if i < split)
                + sum((z[0][i] - z[1][i - 1]) ** 2 for i in lines if i >= split))

    best = min(range(1, 601), key=cost)
    assert alignment.change_point(*lengths, -1) == best
    assert abs(best - 234) <= 10


def test_windows_shorter_than_the_others_are_judged_at_the_end(sides, tmp_path):
    # 1,600 pairs, a target line lost at line 1,001: only the last 600 pairs are out of step.
    # The full windows (lines 1-1,000, 251-1,250, 501-1,500) pass, and when the files end the
    # windows that start every END_STRIDE lines after the last of them are judged.
    source, target = sides[0][:1600], sides[1][:1000] + sides[1][1001:1601]
    src, tgt = write_lines(tmp_path / "a.de", source), write_lines(tmp_path / "a.en", target)
    read = []
    with pytest.raises(CorpusError, match=r"\(in lines [\d,]+-1,600, .* 1 line before them") \
            as error:
        for pair in read_aligned(src, tgt):
            read.append(pair)
    assert len(read) == 1600
    message = str(error.value)
    first = int(message.split("(in lines ")[1].split("-")[0].replace(",", ""))
    assert 501 + alignment.END_STRIDE <= first <= 1001
    at = int(message.split("at about line ")[1].split(":")[0].replace(",", ""))
    assert abs(at - 1001) <= 10
    # A slip MIN_WINDOW + END_STRIDE lines before the end (a target line lost at line 1,101)
    # has a window that starts just after it and holds MIN_WINDOW pairs, all out of step.
    pairs = 1100 + alignment.MIN_WINDOW + alignment.END_STRIDE
    found = alignment.first_out_of_step(zip(sides[0][:pairs],
                                            sides[1][:1100] + sides[1][1101:pairs + 1]))
    assert found["shift"] == -1 and abs(found["at"] - 1101) <= 10 and found["last"] == pairs


@pytest.mark.parametrize("slip", [150, 300, 450, 600, 750, 850, 900, 926])
def test_a_slip_anywhere_but_the_last_two_hundred_lines_of_a_test_set_is_found(sides, slip):
    # A test set's size (1,136 pairs, the embedded corpus' test split): a translation lost at
    # line `slip` (and one added at the end to keep the count) is found wherever a window can
    # start after it and still hold MIN_WINDOW pairs (up to line 926, 210 lines before the end);
    # windows cut in two by the slip pass.
    source, target = sides[0][:1136], sides[1][:1136]
    lost = target[:slip - 1] + target[slip:] + ["The end."]
    found = alignment.first_out_of_step(zip(source, lost))
    assert found is not None and found["shift"] == -1
    assert abs(found["at"] - slip) <= 10 and found["first"] <= slip + alignment.STRIDE
    assert alignment.first_out_of_step(zip(source, target)) is None


def test_a_weak_correlation_with_neighbours_is_no_evidence():
    # Lengths that follow the next line's only weakly (about 0.27) and their own line's
    # inversely (about -0.27): the shifted pairing fits better by more than MARGIN, but no
    # pairing fits well, so nothing is said (the lines of unrelated files look like this).
    rng = np.random.default_rng(3)
    x = rng.normal(size=1001)
    y = 0.3 * x[:-1] - 0.3 * x[1:] + rng.normal(size=1000)  # y[i] = 0.3 x[i-1] - 0.3 x[i] + e
    source = np.round(np.exp(3 + 0.4 * x[1:])).astype(int)
    target = np.round(np.exp(3 + 0.4 * y)).astype(int)
    logs = [math.log1p(n) for n in source], [math.log1p(n) for n in target]
    given, shifted = pearson(*logs), pearson(logs[0][:-1], logs[1][1:])  # shift +1
    assert shifted - given > alignment.MARGIN and 0.1 < shifted < alignment.SHIFTED_CORRELATION
    assert alignment.out_of_step(list(source), list(target)) is None
