"""CPU threads for a process that decodes in parallel searches (translate.py, evaluate.py).

A beam search runs a batch as `parallel_searches` independent searches side by side
(`serving.TranslationModule`). TensorFlow's default lets every op use every core, so on a CPU
the searches split each op over the same cores and wait on each other at every op; with the
cores shared out each search keeps its own (on 2 cores translate.py decoded a file 1.5-1.7x as
fast, docs/serving.md). TF Serving is given the same split by its flags (docs/serving.md);
this module gives it to the tfnmt commands, before the process first runs TensorFlow (its
thread pools are sized then, once).

An export records its number of searches beside the graph (`SEARCH_FILE`, in the SavedModel's
assets.extra, which TF Serving leaves alone) so that a command can read it before loading.
"""
import glob
import json
import os

from tfnmt.cpu_quota import SET_BY_TFNMT, THREAD_VARIABLES, usable_cores

# Searches a batch is split into on a CPU by default (`TranslationModule`'s parallel_searches).
PARALLEL_SEARCHES = 2
# Inside a SavedModel version directory: {"parallel_searches": N}.
SEARCH_FILE = os.path.join("assets.extra", "tfnmt_search.json")


def write_search_settings(path, parallel_searches):
    """Records an export's number of parallel searches (`SEARCH_FILE`).

    Args:
      path: the SavedModel directory.
      parallel_searches: the module's `parallel_searches`.
    """
    os.makedirs(os.path.dirname(os.path.join(path, SEARCH_FILE)), exist_ok=True)
    with open(os.path.join(path, SEARCH_FILE), "w") as f:
        json.dump({"parallel_searches": int(parallel_searches)}, f)


def export_searches(path):
    """An export's number of parallel searches, read without loading it.

    Args:
      path: a SavedModel directory.

    Returns:
      The int recorded in `SEARCH_FILE`, or None (an export made before it, or a damaged file).
    """
    try:
        with open(os.path.join(path, SEARCH_FILE)) as f:
            searches = json.load(f)["parallel_searches"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    valid = isinstance(searches, int) and not isinstance(searches, bool) and searches >= 1
    return searches if valid else None


def gpu_present(gpu_files):
    """Whether this machine has a GPU: one of the glob patterns `gpu_files` (GPU device files,
    `serving.GPU_DEVICE_FILES`) matches a file."""
    return any(glob.glob(pattern) for pattern in gpu_files)


def decoding_threads(searches, cores, environ, gpu_files):
    """Threads per op and ops at once for `searches` parallel searches on `cores` cores.

    Args:
      searches: the searches a batch is split into (None: not known).
      cores: the CPU cores the process may use.
      environ: the process environment: a user's `THREAD_VARIABLES` win (not those
        `cpu_quota.limit_threads` set).
      gpu_files: glob patterns of GPU device files: where one exists, a chunk is one search
        (`serving.search_bounds`).

    Returns:
      (intra-op threads, inter-op threads): cores // searches threads per op (at least 1) and
      as many ops at once as cores; or None, TensorFlow's default, for one search (or an
      unknown number), one core, threads the user set, or a GPU.
    """
    if searches is None or searches < 2 or cores < 2:
        return None
    user_threads = any(environ.get(name) for name in THREAD_VARIABLES) \
        and not environ.get(SET_BY_TFNMT)
    if user_threads or gpu_present(gpu_files):
        return None
    return max(1, cores // searches), cores


def use_decoding_threads(searches):
    """Sizes this process's TensorFlow thread pools for `searches` parallel searches
    (`decoding_threads`), unless TensorFlow already runs (its pools are fixed then).

    Args:
      searches: the searches a batch is split into (None: not known; nothing is changed).

    Returns:
      (intra-op threads, inter-op threads) as set, or None when left as they were.
    """
    import tensorflow as tf

    from tfnmt.inference.serving import GPU_DEVICE_FILES

    threads = decoding_threads(searches, usable_cores(), os.environ, GPU_DEVICE_FILES)
    if threads is None:
        return None
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads[0])
        tf.config.threading.set_inter_op_parallelism_threads(threads[1])
    except RuntimeError:  # TensorFlow runs: its pools are sized
        return None
    return threads
