"""Text files of one sentence per line, as translate.py and evaluate.py read and write them."""
import gzip
import itertools
import os
import shlex
import sys
import zlib

from absl import app


def iter_lines(path, errors="strict", invalid=None):
    """A text file's lines as translate.py and evaluate.py read them, one at a time as they
    arrive: UTF-8 (a leading byte order mark, which Windows editors write, dropped), split at
    "\\n" only (a "\\r" before it dropped). Other line breaks (VT, FF, NEL, U+2028, a lone
    CR...) stay inside their line, as in the exported graph and in the translations written
    back, so line i of one file pairs with line i of another.

    Args:
      path: the file (gzip-compressed where it ends in .gz, as train.py reads corpora), or "-"
        for standard input.
      errors: what invalid UTF-8 does: "strict" raises UnicodeDecodeError (its `start`: the
        byte's offset in the (uncompressed) file), "replace" reads each invalid sequence
        (one byte or a truncated character) as U+FFFD (as the exported graph does).
      invalid: where errors is not "strict", a list to which the number (1 for the first) of
        each line that held invalid UTF-8 is appended as the line is read.

    Yields:
      The lines, without their line breaks; none for an empty file.

    Raises:
      app.UsageError: a .gz file that is not gzip or is damaged part way, naming the last line
        read.
    """
    f = sys.stdin.buffer if path == "-" else (
        gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb"))
    number = -1
    try:
        # The first bytes, not the first line: that of a UTF-16LE file may be an empty one.
        if message := wide_encoding_message(path, head(f)):
            raise app.UsageError(message)
        offset = 0  # of the line in the file
        for number, raw in enumerate(f):  # binary files split at b"\n" only
            start = 3 if number == 0 and raw.startswith(b"\xef\xbb\xbf") else 0
            if start == len(raw):  # a file of a byte order mark only: no line
                return
            try:  # with its line break, which ends an invalid sequence as in the whole file
                line = raw[start:].decode("utf-8")
            except UnicodeDecodeError as error:
                if errors == "strict":
                    raise UnicodeDecodeError("utf-8", raw, offset + start + error.start,
                                             offset + start + error.end, error.reason) from None
                line = raw[start:].decode("utf-8", errors=errors)
                if invalid is not None:
                    invalid.append(number + 1)
            line = line[:-1] if line.endswith("\n") else line
            yield line[:-1] if line.endswith("\r") else line
            offset += len(raw)
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise app.UsageError(f"{path}: unreadable after line {number + 1:,d} ({error})") from None
    finally:
        if f is not sys.stdin.buffer:
            f.close()


HEAD_BYTES = 256  # a file's first bytes, judged by `wide_encoding`


def head(f):
    """The first HEAD_BYTES bytes (or fewer) of the binary file `f`, which stays where it
    was: what `wide_encoding` judges."""
    return f.peek(HEAD_BYTES)[:HEAD_BYTES]


def wide_encoding(start):
    """The encoding of a text file written in UTF-16 or UTF-32 (as Windows' "Unicode" text
    and PowerShell's `>` write it), judged by its first bytes (`head`: from the file's first
    byte, whose position tells the byte order, over a line or more): its byte order mark, or
    else its NUL bytes (a quarter of its bytes or more: UTF-16 has one in every ASCII
    character, UTF-32 three, and UTF-8 text next to none); None for any other file. Read as
    UTF-8, such a file is "invalid UTF-8", or (ASCII text without a byte order mark)
    sentences with a NUL byte between every two letters.

    Returns:
      "UTF-16" or "UTF-32" (with a byte order mark), "UTF-16LE", "UTF-16BE", "UTF-32LE",
      "UTF-32BE" (without), or None.
    """
    for mark, name in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                       (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):
        if start.startswith(mark):
            return name
    if not start or start.count(b"\x00") < len(start) / 4:  # a stray NUL: text
        return None
    bits = 32 if b"\x00\x00\x00" in start else 16
    order = "BE" if start.startswith(b"\x00") else "LE"  # ASCII's zero byte first or last
    return f"UTF-{bits}{order}"


def wide_encoding_message(path, start):
    """What to say of a file (`path`, "-" for stdin) in UTF-16 or UTF-32 (`wide_encoding` of
    its first bytes, `start`), with the command that converts it; None for any other file."""
    encoding = wide_encoding(start)
    if encoding is None:
        return None
    if path == "-":
        return (f"standard input is {encoding} text, not UTF-8 (`iconv -f {encoding} -t UTF-8` "
                "converts it)")
    stem, extension = os.path.splitext(_uncompressed_name(path))
    command = _filter_command(path, f"iconv -f {encoding} -t UTF-8", f"{stem}.utf8{extension}")
    return f"{path}: {encoding} text, not UTF-8 (`{command}` converts it)"


def _uncompressed_name(path):
    return path[:-3] if path.endswith(".gz") else path


def _filter_command(path, command, output):
    """A shell command (to copy; paths quoted) that runs `command` over the file `path`
    (gzip-compressed where it ends in .gz) into `output`."""
    if path.endswith(".gz"):
        return f"zcat {shlex.quote(path)} | {command} > {shlex.quote(output)}"
    return f"{command} {shlex.quote(path)} > {shlex.quote(output)}"


# Lines of which this share or more hold a tab are a TSV of pairs, not a sentence per line.
PAIRS_SHARE = 0.95


def tabbed_pairs(lines):
    """Where `lines` (a file's first, a thousand or so) look like a TSV of pairs
    (`PAIRS_SHARE` of them or more hold a tab), how many do, as messages say it
    ("40 of its first 40 lines hold a tab: a TSV of pairs?"); else None."""
    tabbed = sum("\t" in line for line in lines)
    if not lines or tabbed < PAIRS_SHARE * len(lines):
        return None
    return f"{tabbed:,} of its first {len(lines):,} lines hold a tab: a TSV of pairs?"


def column_cuts(path, columns):
    """Shell commands that write columns of a TSV to files of their own, `<stem>.<column>`
    (train.tsv.gz: `zcat train.tsv.gz | cut -f1 > train.1`).

    Args:
      path: the TSV (gzip-compressed where it ends in .gz).
      columns: 1-based column numbers.

    Returns:
      (the commands, joined by "; ", shell-quoted; [each column's file, as it is]).
    """
    stem = os.path.splitext(_uncompressed_name(path))[0]
    outputs = [f"{stem}.{column}" for column in columns]
    commands = [_filter_command(path, f"cut -f{column}", out)
                for column, out in zip(columns, outputs)]
    return "; ".join(commands), outputs


def listed(names, most_named=10):
    """Names as a message lists them: "a", "a and b", "a, b and c"; past `most_named` the rest
    counted ("a, b and 3 more")."""
    named = list(names[:most_named])
    if len(names) > most_named:
        named.append(f"{len(names) - most_named:,} more")
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


def invalid_utf8_message(numbers, most_named=10):
    """What to tell of the lines (their numbers, 1 for the first) whose invalid UTF-8 was read as
    U+FFFD, or None where there are none."""
    if not numbers:
        return None
    listed_lines = listed([f"{n:,}" for n in numbers], most_named)
    subject = f"line {listed_lines} is" if len(numbers) == 1 else f"lines {listed_lines} are"
    return (f"{subject} not valid UTF-8: U+FFFD stands for the invalid bytes (a file in "
            "another encoding? `iconv -f latin1 -t utf-8` converts Latin-1)")


def read_lines(path, errors="strict"):
    """All of iter_lines(path, errors), a list."""
    return list(iter_lines(path, errors))


class OutputError(OSError):
    """A LineWriter's file that could not be written (a full disk, for example): one line
    naming it and how many lines it got, which the programs print as their error."""


class HeldOutput:
    """What an output file written by `LineWriter` holds, in items of `group` lines (an n-best
    list's N lines per input line), as `held_output` reads it.

    Attributes:
      items: complete items, in its first `end` bytes (uncompressed).
      lines: complete lines (ending in "\n") it holds, in all.
      last: the last line of the last complete item, without its "\n" (None for no item).
      extra: bytes after the complete items (a partial item or line, of a run killed while
        it wrote), which `keep_held` drops.
      damaged: a .gz file whose compressed stream ends part way (a killed run's).
      unreadable: why a .gz file cannot be read on (not gzip, or corrupt data, which no
        killed run leaves), else None.
    """

    def __init__(self, items=0, lines=0, end=0, last=None, extra=0, damaged=False,
                 unreadable=None):
        self.items, self.lines, self.end, self.last = items, lines, end, last
        self.extra, self.damaged, self.unreadable = extra, damaged, unreadable


def held_output(path, group=1):
    """How much of an output file written by `LineWriter` (gzip-compressed where it ends in
    .gz) is complete: its items of `group` lines (a translation per line, or an n-best list of
    `group` lines per input line), up to a killed run's partial line or a damaged gzip
    stream's end. An absent file holds nothing.

    Returns:
      A `HeldOutput`.
    """
    if not os.path.exists(path):
        return HeldOutput()
    held, size, raw = HeldOutput(), 0, None
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            for raw in f:  # binary files split at b"\n" only
                size += len(raw)
                if not raw.endswith(b"\n"):
                    break  # a partial line: the file's end
                held.lines += 1
                if held.lines % group == 0:
                    held.items, held.end, held.last = held.lines // group, size, raw
    except EOFError:  # the stream ends part way
        held.damaged = True
    except (zlib.error, gzip.BadGzipFile) as error:
        held.unreadable = str(error)
    held.extra = size - held.end
    if held.last is not None:
        held.last = held.last[:-1].decode("utf-8", errors="replace")
    return held


def keep_held(path, held):
    """Cuts an output file to its complete items (`held_output`): a plain file is truncated;
    a .gz file whose stream is damaged or holds more is written again with the items' lines
    only (then `LineWriter(path, append=True)` adds a gzip member, which gzip and zcat read
    as one stream)."""
    if not (held.extra or held.damaged):
        return
    if not path.endswith(".gz"):
        os.truncate(path, held.end)
        return
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with gzip.open(path, "rb") as damaged, gzip.open(temporary, "wb") as kept:
            left = held.end
            while left:
                chunk = damaged.read(min(left, 1 << 20))
                if not chunk:  # changed since it was read: keep what is there
                    break
                kept.write(chunk)
                left -= len(chunk)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


class LineWriter:
    """Writes lines to a file (gzip-compressed where it ends in .gz) or stdout ("-"), one per
    item, in UTF-8 (as iter_lines reads them, whatever the locale's encoding: a Latin-1
    terminal's stdout could not take "’"), flushed after each call; a line break inside an
    item becomes a space. The file is created at the first write (or with `append`, added
    to), so a run that fails before translating anything leaves an existing file alone. A
    write that fails raises OutputError (BrokenPipeError, a reader that went away, passes
    unchanged)."""

    def __init__(self, path, append=False):
        self.path, self.file, self.written, self.failed = path, None, 0, False
        self.mode = "ab" if append else "wb"

    def write(self, lines):
        text = "".join(line.replace("\r", " ").replace("\n", " ") + "\n" for line in lines)
        try:
            if self.file is None:
                if self.path == "-":
                    sys.stdout.flush()  # what was printed comes first
                self.file = sys.stdout.buffer if self.path == "-" else (
                    (gzip.open if self.path.endswith(".gz") else open)(self.path, self.mode))
            self.file.write(text.encode("utf-8"))
            self.file.flush()
        except BrokenPipeError:
            raise
        except OSError as error:
            raise self._failure(error) from None
        self.written += len(lines)

    def close(self):
        if self.file is not None and self.file is not sys.stdout.buffer:
            try:
                self.file.close()
            except OSError as error:
                if not self.failed:  # else the first failure is the one to tell
                    raise self._failure(error) from None

    def _failure(self, error):
        self.failed = True
        return OutputError(f"{self.path}: {error.strerror}; {self.written:,d} lines were "
                           "written in full before it")


def windows(items, size):
    """Lists of `size` consecutive items (the last one shorter), taken as they come."""
    items = iter(items)
    while window := list(itertools.islice(items, size)):
        yield window


def count_lines(path):
    """Lines of a file as iter_lines reads them."""
    return sum(1 for _ in iter_lines(path, errors="replace"))


def paired_lines(lines, path, flag, invalid=None):
    """(line, line of `path`) pairs; a UsageError where one file ends before the other (checked
    before any work where both are files). `invalid`: as iter_lines', for `path`."""
    other, count = iter_lines(path, errors="replace", invalid=invalid), 0
    for line in lines:
        paired = next(other, None)
        if paired is None:
            raise app.UsageError(f"--{flag} has {count} lines, fewer than the input")
        yield line, paired
        count += 1
    if next(other, None) is not None:
        raise app.UsageError(f"--{flag} has more lines than the input's {count}")
