"""The memory a search holds per sentence, and how many sentences fit in this machine's.

A step of a beam search of K hypotheses per sentence holds, for each sentence searched
(float32, 4 bytes a value; L decoder layers of width D, V target subwords, output limit T: the
source's subwords + 50):
  - the decoder's self-attention keys and values, L x 2 x K x D x (up to 2T while their stores
    double, `kv_cache`),
  - one layer's keys and values read for the step, 2 x K x D x T,
  - the step's logits over V and what is made of them (log-probabilities, the candidates'
    chunks), 3 x K x V,
  - the K beams' candidates, 3 x K x min(2K, V).
With the usual beams (4-12) that is a few MiB a sentence, and a request's sentences are
searched together. A beam of thousands holds GiBs a sentence (beam 4,000 over 8,000 subwords,
two layers of width 256, a 15-subword sentence: 1.3 GiB measured, 3.2 estimated): a batch of 32
searched at once would exhaust the machine and be killed. `TranslationModule(memory_budget=…)`
searches as many sentences at once as fit in a budget instead, and `check_beam` refuses a beam
of which not even one sentence fits. An export's budget is the serving machine's
(`SERVING_MACHINE`): its graph reads the memory available where it runs
(`available_bytes_in_graph`).
"""
import os

EXTRA_LENGTH = 50  # outputs may be this much longer than their source (paper §6.1)
BYTES = 4  # a float32 value
STORE_GROWTH = 2  # a store doubles when full: up to 2T positions while the old one is copied
LOGIT_COPIES = 3  # [K, V]: logits, log-probabilities, the candidates' chunks
CANDIDATE_COPIES = 3  # [K, min(2K, V)]
# The share of the memory available when a translator is built that its searches may fill.
BUDGET_SHARE = 0.5
MEMINFO = "/proc/meminfo"
CGROUP = "/sys/fs/cgroup"
# The cgroup files of a limit and its usage: v2, then v1.
CGROUP_FILES = (("memory.max", "memory.current"),
                ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"))
# A cgroup limit of this many bytes or more is none (v1 writes "no limit" as ~2^63; v2 "max").
NO_LIMIT = 10 ** 18
# `TranslationModule(memory_budget=SERVING_MACHINE)`: BUDGET_SHARE of the memory available on
# the machine that runs the graph.
SERVING_MACHINE = "serving machine"


class SearchMemoryError(ValueError):
    """A search that does not fit in this machine's memory for one sentence (one line)."""


def _model_sizes(settings):
    """(decoder layers, width, target vocabulary) of a model's settings (a `Transformer`'s, or
    settings.json's "model" section)."""
    layers = settings.get("num_decoder_layers") or settings["num_layers"]
    vocab = settings.get("target_vocab_size") or settings["vocab_size"]
    return int(layers), int(settings["d_model"]), int(vocab)


def sentence_bytes(settings, beam_size, output_limit):
    """The memory one sentence's search holds at its largest step (module docstring).

    Args:
      settings: the model's settings (a `Transformer`'s, or settings.json's "model").
      beam_size: hypotheses per sentence (1 for greedy search or sampling).
      output_limit: T, the longest output: a Python int, or an int64 tensor (in a graph).

    Returns:
      Bytes, of the type of `output_limit`.
    """
    layers, width, vocab = _model_sizes(settings)
    per_position = (layers * 2 * STORE_GROWTH + 2) * width  # keys and values, per output step
    fixed = LOGIT_COPIES * vocab + CANDIDATE_COPIES * min(2 * beam_size, vocab)
    return BYTES * beam_size * (per_position * output_limit + fixed)


def available_bytes(meminfo=MEMINFO, cgroup=CGROUP):
    """The memory this process may still take: the kernel's MemAvailable, or less where a
    cgroup (a container) limits the process; None where neither can be read.

    Args:
      meminfo: /proc/meminfo (tests give their own).
      cgroup: the cgroup file system (v2 memory.max / memory.current, or v1's memory/
        memory.limit_in_bytes / memory.usage_in_bytes).
    """
    found = []
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in CGROUP_FILES:
        try:
            with open(os.path.join(cgroup, limit_file)) as f:
                limit = f.read().strip()
            with open(os.path.join(cgroup, usage_file)) as f:
                usage = int(f.read().strip())
            if limit != "max" and int(limit) < NO_LIMIT:
                found.append(max(int(limit) - usage, 0))
        except (OSError, ValueError):
            continue
    return min(found) if found else None


def available_bytes_in_graph(meminfo=MEMINFO, cgroup=CGROUP):
    """In the graph: `available_bytes` of the machine that runs it (an export's is the serving
    machine's; a Python-side reading would be the exporting machine's), read each time the
    graph runs (a few small files, at every request).

    Args:
      meminfo, cgroup: as `available_bytes` (tests give their own).

    Returns:
      An int64 scalar tensor: bytes, or -1 where neither can be read.
    """
    import tensorflow as tf

    def number(path, pattern):
        """(whether the file at `path` exists and all of it matches `pattern`, RE2 with the
        number in its first group; that number, 0 where not)."""
        def read():
            text = tf.io.read_file(path)
            found = tf.strings.regex_full_match(text, pattern)
            digits = tf.where(found, tf.strings.regex_replace(text, pattern, r"\1"), "0")
            return found, tf.strings.to_number(digits, tf.int64)

        present = tf.size(tf.io.matching_files(path)) > 0
        return tf.cond(present, read,
                       lambda: (tf.constant(False), tf.constant(0, tf.int64)))

    # At most 18 digits: below NO_LIMIT, and never out of int64's range.
    whole = r"\s*(\d{1,18})\s*"
    found, values = [], []
    memory_available, kib = number(meminfo, r"(?s)(?:.*\n)?MemAvailable:\s*(\d{1,18})\b.*")
    found.append(memory_available)
    values.append(kib * 1024)
    for limit_file, usage_file in CGROUP_FILES:
        has_limit, limit = number(os.path.join(cgroup, limit_file), whole)
        has_usage, usage = number(os.path.join(cgroup, usage_file), whole)
        found.append(tf.logical_and(has_limit, has_usage))
        values.append(tf.maximum(limit - usage, 0))
    found, values = tf.stack(found), tf.stack(values)
    least = tf.reduce_min(tf.where(found, values, tf.int64.max))
    return tf.where(tf.reduce_any(found), least, tf.constant(-1, tf.int64))


def memory_budget(available=None):
    """Bytes a translator's searches may fill at once: `BUDGET_SHARE` of the memory available
    (`available_bytes` when not given); None where it cannot be told (no cap)."""
    available = available_bytes() if available is None else available
    return None if available is None else int(available * BUDGET_SHARE)


def sentences_at_once(settings, beam_size, output_limit, budget, most):
    """How many sentences of output limit `output_limit` to search at once within `budget`
    bytes: at least 1, at most `most` (Python ints)."""
    fit = budget // sentence_bytes(settings, beam_size, output_limit)
    return int(min(max(fit, 1), most))


def gib(size):
    """Bytes as a message gives them: "3.5 GiB" (two significant digits under 10)."""
    value = size / 2 ** 30
    return f"{value:.2g} GiB" if value < 10 else f"{value:,.0f} GiB"


def check_beam(settings, beam_size, flag="--beam_size", available=None,
               extra_length=EXTRA_LENGTH):
    """Refuses a beam of which one sentence of one subword would not fit in the memory
    available (its search would be killed for memory, or fail after a long while).

    Args:
      settings: the model's settings.
      beam_size: hypotheses per sentence.
      flag: the flag that set it, as the message names it.
      available: the bytes available (default `available_bytes()`; no check where unknown).
      extra_length: the output limit beyond the source's length.

    Raises:
      SearchMemoryError: one line naming the memory one sentence needs and the memory there is.
    """
    available = available_bytes() if available is None else available
    if available is None:
        return
    needed = sentence_bytes(settings, beam_size, 2 + extra_length)  # a subword and EOS
    if needed > available:
        layers, width, vocab = _model_sizes(settings)
        low, high = 1, beam_size  # the widest beam that fits: sentence_bytes grows with it
        while low < high:
            middle = (low + high + 1) // 2
            if sentence_bytes(settings, middle, 2 + extra_length) <= available:
                low = middle
            else:
                high = middle - 1
        raise SearchMemoryError(
            f"{flag}={beam_size}: a search of {beam_size:,} hypotheses holds about "
            f"{gib(needed)} per sentence with this model ({vocab:,} target subwords, "
            f"{layers} decoder layer{'s' if layers != 1 else ''} of width {width}), more than "
            f"the {gib(available)} this machine has available: give at most {low:,}")
