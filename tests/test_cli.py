"""The entry points' command lines: what they refuse before any work."""
import re

import pytest


@pytest.mark.parametrize("program, flag, message", [
    ("translate.py", "--alpha=-1.5", "--alpha must be >= 0 and finite"),
    ("translate.py", "--alpha=nan", "--alpha must be >= 0 and finite"),
    ("translate.py", "--alpha=inf", "--alpha must be >= 0 and finite"),
    ("evaluate.py", "--batch_size=0", "--batch_size must be positive"),
    ("evaluate.py", "--batch_size=-3", "--batch_size must be positive"),
    ("evaluate.py", "--beam_size=0", "--beam_size must be positive"),
    ("evaluate.py", "--alpha=-0.5", "--alpha must be >= 0 and finite"),
    ("export.py", "--alpha=inf", "--alpha must be >= 0 and finite"),
    ("export.py", "--version=-1", "--version must be >= 0"),
    ("translate.py", "--seed=99999999999999999999", "--seed must fit in 64 bits"),
    ("translate.py", "--no_repeat_ngram_size=-1", "--no_repeat_ngram_size must be >= 0"),
    ("export.py", "--no_repeat_ngram_size=-2", "--no_repeat_ngram_size must be >= 0"),
    ("train.py", "--no_repeat_ngram_size=-3", "--no_repeat_ngram_size must be >= 0"),
])
def test_bad_decoding_flags_fail_fast(program, flag, message, tmp_path):
    # Refused in one line before any model is read: unchecked, a negative batch size would
    # translate nothing and score empty translations, and a version "-1" is a directory TF
    # Serving and --export do not read.
    from helpers import python

    result = python(program, f"--model_dir={tmp_path}", flag, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"{program}: flag {flag}: {message}"
    assert not list(tmp_path.iterdir())


def test_translate_lines_refuses_a_batch_size_below_one():
    from tfnmt.inference.batching import translate_lines

    for batch_size in (0, -3):
        with pytest.raises(ValueError, match="batch_size must be positive"):
            translate_lines(lambda batch: None, ["a"], batch_size)


def test_cannot_write_in_creates_a_file_to_know(tmp_path):
    from tfnmt.paths import cannot_write_in

    assert cannot_write_in(str(tmp_path)) is None
    assert cannot_write_in(str(tmp_path / "to" / "be" / "made")) is None  # judged by tmp_path
    assert not list(tmp_path.iterdir())  # the probe is removed, nothing made
    for path in ("/sys", "/sys/to/be/made"):  # no one creates files in sysfs, root neither
        assert cannot_write_in(path) in ("Permission denied", "Read-only file system")


def test_evaluate_py_refuses_an_output_it_could_not_write_before_translating(tmp_path):
    # --output is written after the translations (minutes for a test set): a path that cannot
    # be written is refused first, in one line.
    from helpers import python

    (tmp_path / "src.de").write_text("Das ist ein Haus.\n")
    (tmp_path / "ref.en").write_text("This is a house.\n")
    for output, reason in ((tmp_path / "missing" / "out.en",
                            f"directory {tmp_path / 'missing'} does not exist"),
                           (tmp_path, "is a directory, not a file"),
                           (tmp_path / "ref.en", "is the --reference file, which writing the "
                                                 "output would overwrite")):
        result = python("evaluate.py", f"--model_dir={tmp_path / 'no_model'}",
                        f"--source={tmp_path / 'src.de'}", f"--reference={tmp_path / 'ref.en'}",
                        f"--output={output}", timeout=60)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == f"evaluate.py: --output {output}: {reason}"
    # A directory no file can be created in, root's too (sysfs), which os.access passed as root.
    result = python("evaluate.py", f"--model_dir={tmp_path / 'no_model'}",
                    f"--source={tmp_path / 'src.de'}", f"--reference={tmp_path / 'ref.en'}",
                    "--output=/sys/out.en", timeout=60)
    assert result.returncode == 1
    assert re.fullmatch(r"evaluate\.py: --output /sys/out\.en: directory /sys is not writable "
                        r"\((Permission denied|Read-only file system)\)",
                        result.stderr.strip().splitlines()[-1]), result.stderr[-2000:]
    assert (tmp_path / "ref.en").read_text() == "This is a house.\n"
    result = python("evaluate.py", f"--hypotheses={tmp_path / 'src.de'}",
                    f"--reference={tmp_path / 'ref.en'}", f"--output={tmp_path / 'out.en'}",
                    timeout=60)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        "evaluate.py: --output writes translations, and --hypotheses translates nothing")


@pytest.mark.parametrize("program", ["translate.py", "evaluate.py"])
@pytest.mark.parametrize("flag", ["--beam_size=8", "--alpha=1.0", "--beam_stop=bound",
                                  "--no_repeat_ngram_size=4", "--checkpoint=latest"])
def test_a_checkpoint_search_flag_with_an_export_is_refused_not_ignored(program, flag, tmp_path):
    # An export searches with the beam, penalty, stop rule and checkpoint export.py gave it.
    from helpers import python

    name = flag.split("=")[0]
    result = python(program, f"--export={tmp_path / 'export'}", flag, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"{program}: {name} applies to --model_dir; an export searches as export.py built it "
        f"(export.py {name})")


@pytest.mark.parametrize("flags, message", [
    (["--sampling_temperature=0.7"], "--sampling_temperature is for sampling: give "
                                     "--sampling_topk (0: among all words)"),
    (["--seed=3"], "--seed is for sampling: give --sampling_topk (0: among all words)"),
    (["--score_targets=t.en", "--n_best=2"], "--score_targets scores the given translations, "
                                             "translating nothing: drop --n_best and "
                                             "--sampling_topk"),
    (["--score_targets=t.en", "--sampling_topk=5"], "--score_targets scores the given "
                                                     "translations, translating nothing: drop "
                                                     "--n_best and --sampling_topk"),
])
def test_translate_py_flags_that_would_be_ignored_are_refused(flags, message, tmp_path):
    from helpers import python

    result = python("translate.py", f"--model_dir={tmp_path}", *flags, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"translate.py: {message}"


@pytest.mark.parametrize("case", ["input", "target_prefix", "count"])
def test_translate_py_refuses_what_would_lose_data_before_any_work(case, tmp_path):
    # Output is written window by window while input is read: an --output that is one of the
    # files being read would be emptied before it is read. Files of unequal line counts are
    # refused before anything is translated. No file is touched.
    from helpers import python

    source, prefixes = tmp_path / "in.de", tmp_path / "prefixes.en"
    source.write_text("Ein Haus.\nZwei Häuser.\n", encoding="utf-8")
    prefixes.write_text("A\n" if case == "count" else "A\nTwo\n", encoding="utf-8")
    output = {"input": source, "target_prefix": prefixes, "count": tmp_path / "out.en"}[case]
    before = {path: path.read_bytes() for path in (source, prefixes)}
    result = python("translate.py", f"--model_dir={tmp_path / 'model'}", f"--input={source}",
                    f"--target_prefix={prefixes}", f"--output={output}", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "translate.py: " + (
        "--target_prefix has 1 line for 2 input lines" if case == "count" else
        f"--output {output}: is the --{case} file, which writing the output would overwrite")
    assert {path: path.read_bytes() for path in (source, prefixes)} == before
    assert not (tmp_path / "out.en").exists()


def test_a_missing_or_misplaced_model_is_named_before_tensorflow_loads(tmp_path):
    # A mistyped --model_dir or --export is refused in one line without the seconds TensorFlow
    # takes to load; a directory of another of tfnmt's kinds is named as what it is.
    from helpers import imported_modules, python

    version, run, missing = tmp_path / "export" / "1", tmp_path / "run", tmp_path / "missing"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    run.mkdir()
    (run / "settings.json").write_text('{"data": {"dataset": "embedded"}}')
    (tmp_path / "src.de").write_text("Ein Haus.\n")
    (tmp_path / "ref.en").write_text("A house.\n")
    files = [f"--source={tmp_path / 'src.de'}", f"--reference={tmp_path / 'ref.en'}"]
    no_export = "holds no SavedModel and no numbered version of one"
    no_model = "holds no trained model (no settings.json)"
    export_hint = "it is a SavedModel export: translate.py and evaluate.py read it with --export"
    run_hint = "it is a training directory: give it as --model_dir"
    for program, flags, message in (
            ("translate.py", [f"--export={missing}"], f"{missing} {no_export}"),
            ("translate.py", [f"--export={run}"], f"{run} {no_export}; {run_hint}"),
            ("translate.py", [f"--model_dir={missing}"], f"{missing} {no_model}"),
            ("translate.py", [f"--model_dir={version.parent}"],
             f"{version.parent} {no_model}; {export_hint}"),
            ("evaluate.py", [f"--export={missing}", *files], f"{missing} {no_export}"),
            ("evaluate.py", [f"--export={run}", *files], f"{run} {no_export}; {run_hint}"),
            ("evaluate.py", [f"--model_dir={missing}", *files], f"{missing} {no_model}"),
            ("evaluate.py", [f"--export={missing}", f"--model_dir={run}"],
             f"{missing} {no_export}"),
            ("export.py", [f"--model_dir={missing}"], f"{missing} {no_model}"),
            ("export.py", [f"--model_dir={version}"], f"{version} {no_model}; {export_hint}")):
        result = python(program, *flags, env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=60)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == f"{program}: {message}"
        imported = imported_modules(result.stderr)
        assert "absl.app" in imported and "tensorflow" not in imported, (program, flags)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "ref.en", "run", "src.de"]


FINALIZER_INTERRUPTED = """
import signal, sys, time
sys.path.insert(0, sys.argv[1])
from tfnmt import cli

if sys.argv[2] == "kept":
    cli.keep_interrupts()
    cli.stop_on_sigterm()


class Finalized:
    def __del__(self):
        signal.raise_signal(getattr(signal, sys.argv[3]))  # Ctrl-C, SIGTERM in a finalizer
        for _ in range(1000):  # Python's handler raises KeyboardInterrupt in here
            pass


try:
    Finalized()
    deadline = time.monotonic() + 5
    while True:  # not `while <test>: pass`, from which CPython 3.13 lets a KeyboardInterrupt
        if time.monotonic() >= deadline:  # escape its try (CPython issue 130279)
            break
    print("went on")
except KeyboardInterrupt as interrupt:
    print("stopped:", type(interrupt).__name__)
"""


@pytest.mark.parametrize("kept", [True, False])
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_ctrl_c_in_a_finalizer_stops_the_program(kept, signal_name):
    # Python prints a KeyboardInterrupt raised in a __del__ as "Exception ignored in ..." and
    # goes on: a Ctrl-C landing in one of TensorFlow's finalizers let train.py run to its end.
    # The entry points (cli.run) raise it again outside the finalizer, and raise SIGTERM as a
    # KeyboardInterrupt of its own kind, so that a program cleans up as for Ctrl-C. Plain
    # Python (the reference) loses a Ctrl-C there, and dies at once of SIGTERM.
    import signal
    import subprocess
    import sys

    from helpers import ROOT

    # SIGINT acting as at a terminal (a test runner started in the background ignores it).
    result = subprocess.run([sys.executable, "-c", FINALIZER_INTERRUPTED, ROOT,
                             "kept" if kept else "plain", signal_name], capture_output=True,
                            text=True, timeout=60,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if kept:
        kind = "KeyboardInterrupt" if signal_name == "SIGINT" else "Terminated"
        assert (result.returncode, result.stdout.strip()) == (0, f"stopped: {kind}")
    elif signal_name == "SIGINT":
        assert (result.returncode, result.stdout.strip()) == (0, "went on")
    else:
        assert (result.returncode, result.stdout) == (-signal.SIGTERM, "")
    # Python's note on the lost exception, which the entry points leave out.
    assert ("Exception ignored" in result.stderr) is (signal_name == "SIGINT" and not kept)



STOPPED_IN_A_CLUSTER = """
import atexit, sys
sys.path.insert(0, sys.argv[1])
from absl import app
from tfnmt import cli


def main(argv):
    # As TensorFlow's heartbeat thread logs a lost cluster task while the interpreter tears down.
    atexit.register(lambda: print("logged at teardown", file=sys.stderr, flush=True))
    print("the run's last line")  # stdout is a pipe here: buffered
    stop = getattr(cli, argv[2], None) or getattr(app, argv[2])
    raise stop("the chief stopped")


cli.run(main)
"""


@pytest.mark.parametrize("raised", ["ExitAtOnce", "UsageError"])
def test_a_stop_at_once_is_the_programs_last_line_and_loses_no_output(raised, tmp_path):
    # A cluster worker whose chief had stopped printed its line, then TensorFlow's heartbeat
    # thread logged the lost chief after it as the interpreter tore down. A UsageError (the
    # reference) goes through that teardown; an ExitAtOnce ends the process after its line.
    import os
    import subprocess
    import sys

    from helpers import ROOT

    program = tmp_path / "program.py"
    program.write_text(STOPPED_IN_A_CLUSTER)
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    result = subprocess.run([sys.executable, str(program), ROOT, raised], capture_output=True,
                            text=True, timeout=60, env=environment)
    assert (result.returncode, result.stdout) == (1, "the run's last line\n"), result.stderr
    lines = result.stderr.strip().splitlines()
    assert "program.py: the chief stopped" in lines, result.stderr
    assert lines[-1] == ("program.py: the chief stopped" if raised == "ExitAtOnce"
                         else "logged at teardown"), result.stderr


@pytest.mark.parametrize("program", ["train.py", "export.py", "translate.py", "evaluate.py"])
def test_help_lists_every_flag_of_the_program_with_its_default(program):
    # README: `python train.py --help  # every flag, with its default`. absl's --help lists the
    # flags of the module run as the program (a shim or a console script), not of the modules
    # where tfnmt defines them.
    import json
    import re
    import subprocess
    import sys

    from helpers import ROOT, imported_modules, python

    # The flags the program defines, and their defaults, from absl's registry in a process of
    # their own (the programs define flags of the same names).
    module = "tfnmt.programs." + program[:-len(".py")]
    listing = subprocess.run(
        [sys.executable, "-c",
         f"import json, {module}; from absl import flags; print(json.dumps({{f.name: "
         "f.default for m, fs in flags.FLAGS.flags_by_module_dict().items() "
         "if m.startswith('tfnmt') for f in fs}))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    defined = json.loads(listing.stdout)
    assert len(defined) >= 10, listing.stderr[-2000:]
    result = python(program, "--help", env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=60)
    listed = {}  # flag name -> its entry in the help, on one line
    for entry in re.split(r"\n  (?=--)", result.stdout.split("\nflags:\n", 1)[-1]):
        name = re.match(r"--(?:\[no\])?(\w+)", entry)
        if name:
            listed[name[1]] = " ".join(entry.split())
    assert set(defined) <= set(listed), sorted(set(defined) - set(listed))
    for name, default in defined.items():
        if default is not None:
            shown = (str(default).lower() if isinstance(default, bool) else
                     ",".join(default) if isinstance(default, list) else default)
            assert f"(default: '{shown}')" in listed[name], listed[name]
    assert "tensorflow" not in imported_modules(result.stderr)  # no TensorFlow start for it


def test_a_leading_tilde_in_a_path_flag_is_the_home_directory(tmp_path, monkeypatch):
    # The shell leaves "~" as it is after "--model_dir=": train.py made a directory named "~"
    # in the working directory.
    from helpers import python
    from tfnmt.cli import expand_home

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = str(tmp_path / "home")
    assert expand_home("~/a.de,~/a.en") == f"{home}/a.de,{home}/a.en"
    assert expand_home(["~", "runs/~x", "best"]) == [home, "runs/~x", "best"]
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "file").write_text("not a directory")
    (tmp_path / "home" / "empty.tsv").write_text("")
    (tmp_path / "work").mkdir()
    for flags, message in ((["--model_dir=~/file"], f"--model_dir={home}/file is a file, not a "
                                                    "directory"),
                           (["--model_dir=~/run", "--train_files=~/empty.tsv",
                             "--dev_files=~/empty.tsv"], f"--train_files: {home}/empty.tsv is "
                                                         "empty")):
        result = python("train.py", *flags, env={"HOME": home}, cwd=str(tmp_path / "work"),
                        timeout=60)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == f"train.py: {message}"
    assert not list((tmp_path / "work").iterdir())


@pytest.mark.parametrize("program,flag", [
    ("train.py", "--model_dir=gs://my-bucket/runs/de-en"),
    ("train.py", "--data_dir=s3://bucket/data"),
    ("train.py", "--train_files=hdfs://namenode/a.de,hdfs://namenode/a.en"),
    ("export.py", "--export_dir=gs://bucket/export"),
    ("translate.py", "--export=GS://bucket/export"),
    ("evaluate.py", "--reference=https://example.org/test.en"),
])
def test_a_url_in_a_path_flag_is_refused_not_made_a_local_directory(program, flag, tmp_path):
    # Python's file functions take "gs://my-bucket/runs" for the relative path "gs:/my-bucket/
    # runs": train.py trained into a local directory "gs:", lost with the machine.
    from helpers import python

    result = python(program, flag, cwd=str(tmp_path), timeout=60)
    assert result.returncode == 1
    value = flag.split("=", 1)[1].split(",")[0]
    assert result.stderr.strip().splitlines()[-1] == (
        f"{program}: {flag.split('=')[0]}={value} is a URL; tfnmt reads and writes paths on this "
        "machine's file systems: copy the files here, or mount the bucket (gcsfuse, "
        "mountpoint-s3, s3fs) and give its local path")
    assert not list(tmp_path.iterdir())


def test_a_file_url_is_the_path_it_names_and_tfds_reads_its_own_data_dir(tmp_path):
    from helpers import python
    from tfnmt.cli import local_paths

    assert local_paths("train_files", "file:///d/a%20b.de,b.en") == "/d/a b.de,b.en"
    assert local_paths("input", ["file:///x", "-"]) == ["/x", "-"]
    with pytest.raises(ValueError, match="--model_dir=file://host/run is a URL"):
        local_paths("model_dir", "file://host/run")  # another machine's file
    (tmp_path / "my run").write_text("not a directory")
    result = python("train.py", f"--model_dir=file://{tmp_path}/my%20run", timeout=60)
    assert result.stderr.strip().splitlines()[-1] == (
        f"train.py: --model_dir={tmp_path}/my run is a file, not a directory")
    # A bucket is TFDS's to read (tf.io.gfile): --tfds_data_dir passes as given.
    result = python("train.py", "--dataset=files", "--train_files=a.tsv", "--dev_files=b.tsv",
                    "--tfds_data_dir=gs://tfds-data/datasets", cwd=str(tmp_path), timeout=60)
    assert result.stderr.strip().splitlines()[-1] == (
        "train.py: --tfds_data_dir is where TFDS datasets are, and --dataset=files reads your "
        "files: drop --tfds_data_dir")


def test_output_in_a_locale_that_cannot_encode_it_is_written_not_a_traceback(tiny_model_dir,
                                                                             tmp_path):
    # A Latin-1 locale's stdout (LANG=de_DE.ISO-8859-1, or PYTHONIOENCODING): translate.py
    # translated, then died with UnicodeEncodeError at "’" (its output lost); evaluate.py and
    # export.py the same at a path they print.
    import os
    import subprocess
    import sys

    from helpers import ROOT, python

    (tmp_path / "日本.en").write_text("’ a house .\n")
    (tmp_path / "ref.en").write_text("’ a house .\n")
    latin1 = {"PYTHONIOENCODING": "latin-1"}
    result = python("evaluate.py", "--hypotheses=日本.en", "--reference=ref.en", env=latin1,
                    cwd=str(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "\\u65e5\\u672c.en: 1 sentence"  # as stderr does
    assert result.stdout.splitlines()[2].startswith("  chrF2  100.00")
    (tmp_path / "prefix.en").write_text("’ 日本\n")  # the translation starts with it
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "translate.py"), f"--model_dir={tiny_model_dir}",
         "--target_prefix=prefix.en"], input="Das ist ein Haus.\n".encode(),
        capture_output=True, cwd=str(tmp_path), env=dict(os.environ, **latin1), timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.decode("utf-8").startswith("’ 日本")  # UTF-8, as the input is read


def test_a_low_address_space_cap_is_warned_of_before_tensorflow_aborts_at_it(tmp_path):
    # Under `ulimit -v 4000000` (Grid Engine's h_vmem sets it) a tiny model trained, then
    # TensorFlow aborted with "pthread_create() failed" and a stack trace.
    import os
    import resource
    import subprocess
    import sys

    from helpers import ROOT

    (tmp_path / "a.en").write_text("a house\n")
    for cap, warned in ((6 << 30, True), (resource.RLIM_INFINITY, False)):
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "evaluate.py"), "--hypotheses=a.en",
             "--reference=a.en"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith("evaluate.py: warning: this process may map 6.0 GiB of "
                                         "address space (`ulimit -v`") == warned, result.stderr


def _flag_files(directory):
    """The files the refused command lines below name: text, Latin-1 and empty files, and a
    training directory whose settings name no data."""
    (directory / "one.de").write_text("Ein Haus.\n", encoding="utf-8")
    (directory / "one.en").write_text("A house.\n", encoding="utf-8")
    (directory / "latin1.en").write_bytes("Käse\n".encode("latin-1"))
    (directory / "empty.en").write_text("")
    (directory / "trained").mkdir()
    (directory / "trained" / "settings.json").write_text('{"data": {}}')


@pytest.mark.parametrize("program, flags, message", [
    ("translate.py", ["--model_dir=m", "extra"], "unexpected arguments: extra"),
    ("translate.py", [], "give exactly one of --model_dir and --export"),
    ("translate.py", ["--model_dir=m", "--export=e"], "give exactly one of --model_dir and "
                                                      "--export"),
    ("translate.py", ["--export=e", "--plot_attention=plots"],
     "--plot_attention needs --model_dir (weights come from the model)"),
    ("translate.py", ["--model_dir=m", "--plot_attention=plots", "--n_best=2"],
     "--plot_attention plots the first sentence's translation: drop --n_best, --score_targets "
     "and --target_prefix"),
    ("translate.py", ["--model_dir=m", "--plot_attention=plots", "--target_prefix=one.en"],
     "--plot_attention plots the first sentence's translation: drop --n_best, --score_targets "
     "and --target_prefix"),
    ("translate.py", ["--model_dir=m", "--plot_attention=one.en"],
     "--plot_attention=one.en is a file, not a directory"),
    ("translate.py", ["--export=e", "--sampling_topk=5"],
     "sampling needs --model_dir or a CTranslate2 model (SavedModel exports search with "
     "beams)"),
    ("translate.py", ["--model_dir=m", "--sampling_topk=5", "--n_best=2"],
     "sampling draws one translation per sentence: drop --n_best"),
    ("translate.py", ["--model_dir=m", "--sampling_topk=5", "--no_repeat_ngram_size=3"],
     "--no_repeat_ngram_size is a beam search rule: drop it or --sampling_topk"),
    ("translate.py", ["--model_dir=m", "--input=trained"],
     "--input trained: is a directory, not a file"),
    ("translate.py", ["--model_dir=m", "--score_targets=trained"],
     "--score_targets trained: is a directory, not a file"),
    ("translate.py", ["--model_dir=m", "--target_prefix=one.en", "--n_best=2"],
     "--target_prefix gives one translation per line: drop --n_best and --score_targets"),
    ("translate.py", ["--model_dir=m", "--target_prefix=one.en", "--score_targets=one.en"],
     "--target_prefix gives one translation per line: drop --n_best and --score_targets"),
    ("evaluate.py", ["--model_dir=m", "extra"], "unexpected arguments: extra"),
    ("evaluate.py", ["--hypotheses=one.en", "--reference=one.en", "--batch_size=8"],
     "--batch_size is for translating, and --hypotheses scores translations made elsewhere: "
     "drop --batch_size"),
    ("evaluate.py", ["--hypotheses=-", "--reference=one.en", "--baseline=-"],
     "--hypotheses and --baseline both read standard input ('-'): give all but one as files"),
    ("evaluate.py", ["--source=-", "--reference=-", "--reference=-"],
     "--source and --reference and --reference all read standard input ('-'): give all but "
     "one as files"),
    ("evaluate.py", ["--hypotheses=one.en", "--reference=one.en", "--no_repeat_ngram_size=4"],
     "--no_repeat_ngram_size is for translating, and --hypotheses scores translations made "
     "elsewhere: drop --no_repeat_ngram_size"),
    ("evaluate.py", ["--source=one.de", "--hypotheses=one.en", "--reference=one.en"],
     "give --source (to translate) or --hypotheses (translated), not both"),
    ("evaluate.py", ["--source=one.de"], "--source needs --reference"),
    ("evaluate.py", ["--reference=one.en"],
     "--reference needs --source (to translate) or --hypotheses"),
    ("evaluate.py", ["--hypotheses=latin1.en", "--reference=one.en"],
     "--hypotheses=latin1.en: not UTF-8 text (invalid continuation byte at byte 1)"),
    ("evaluate.py", ["--hypotheses=empty.en", "--reference=empty.en"],
     "--hypotheses and --reference are empty: nothing to score"),
    ("evaluate.py", ["--model_dir=trained"], "trained/settings.json names no dataset (its "
                                             "data.dataset): give --source and --reference"),
    ("export.py", ["--model_dir=m", "extra"], "unexpected arguments: extra"),
    ("export.py", ["--model_dir=m", "--quantization=int8"],
     "--quantization needs --format=ctranslate2"),
    *[("export.py", ["--model_dir=trained", "--format=ctranslate2", f"--{name}={value}"],
       f"--{name} is for SavedModel exports; CTranslate2 takes its decoding options when it "
       "translates")
      for name, value in (("version", 3), ("beam_size", 5),
                          ("beam_stop", "finished"), ("max_decode_length", 9),
                          ("matmul_dtype", "float32"), ("n_best", 1),
                          ("parallel_searches", 1), ("chunk_size", 8))],
    ("train.py", ["--model_dir=m", "extra"], "unexpected arguments: extra"),
    ("train.py", ["--model_dir=m", "--train_files=one.de,one.en"],
     "--dataset=files needs --dev_files: evaluation reports dev BLEU"),
    ("train.py", ["--model_dir=m", "--train_files=one.de,one.en", "--dev_files=one.de,one.en",
                  "--train_weights=abc"], "--train_weights=abc: numbers, one per --train_files"),
    ("train.py", ["--model_dir=m", "--init_optimizer"], "--init_optimizer needs --init_from"),
    ("train.py", ["--model_dir=m", "--separate_vocabularies", "--share_embeddings"],
     "--share_embeddings needs one shared vocabulary: drop it or --separate_vocabularies"),
    ("train.py", ["--model_dir=m", "--train_files=one.de,one.en", "--dev_files=one.de,one.en",
                  "--train_weights=1,2"],
     "--train_weights=1,2: 2 weight(s) for 1 --train_files: one per corpus, in their order"),
    ("train.py", ["--model_dir=m", "--train_files=one.de,one.en", "--train_files=one.de,one.en",
                  "--dev_files=one.de,one.en", "--train_weights=1"],
     "--train_weights=1: 1 weight(s) for 2 --train_files: one per corpus, in their order"),
    ("train.py", ["--model_dir=m", "--init_from=trained", "--vocab=one.model"],
     "--vocab: a fine-tuned model keeps its source's vocabulary (--init_from): drop --vocab"),
    ("train.py", ["--model_dir=m", "--vocab=de.model,en.model", "--share_embeddings"],
     "--share_embeddings needs one shared vocabulary, and --vocab gives two: drop "
     "--share_embeddings"),
    ("train.py", ["--model_dir=m", "--vocab=one.model", "--separate_vocabularies"],
     "--separate_vocabularies needs two --vocab models (source.model,target.model)"),
])
def test_contradictory_or_unusable_flags_are_refused_in_one_line(program, flags, message,
                                                                 tmp_path):
    # Each would otherwise be ignored, or fail later, after minutes of work; nothing is written.
    from helpers import python

    _flag_files(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = python(program, *flags, timeout=60, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"{program}: {message}"
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("program, flags, pattern", [
    ("export.py", ["--model_dir=trained", "--export_dir=/sys/export"],
     r"/sys/export: cannot write in it \((Permission denied|Read-only file system)\)"),
    ("train.py", ["--model_dir=/sys/run"], r"--model_dir=/sys/run: cannot create it \("
                                          r"(Operation not permitted|Permission denied|"
                                          r"Read-only file system)\)"),
    ("train.py", ["--model_dir=/sys"], r"--model_dir=/sys: cannot write in it \((Permission "
                                       r"denied|Read-only file system)\): train.py keeps its "
                                       r"settings, checkpoints and summaries there"),
])
def test_a_directory_that_cannot_be_written_is_refused_before_any_work(program, flags, pattern,
                                                                       tmp_path):
    # sysfs: no one creates files there, root neither (os.access would pass root).
    from helpers import python

    _flag_files(tmp_path)
    result = python(program, *flags, timeout=60, cwd=tmp_path)
    assert result.returncode == 1
    assert re.fullmatch(f"{program}: {pattern}", result.stderr.strip().splitlines()[-1]), \
        result.stderr[-2000:]


def test_an_atomic_write_that_fills_the_disk_keeps_the_old_file_and_names_it(tmp_path):
    # A 64 KiB file system (tmpfs in a private mount namespace): the old file stays whole, no
    # temporary file is left, and the error names the file (a failed write names none, and
    # train.py's full-disk line said "to write a file").
    import errno
    import shlex
    import subprocess
    import sys

    from helpers import ROOT

    disk = tmp_path / "small_disk"
    disk.mkdir()
    code = ("import os, sys; from tfnmt.paths import write_atomically\n"
            "path = os.path.join(sys.argv[1], 'settings.json')\n"
            "write_atomically(path, 'old')\n"
            "try:\n"
            "    write_atomically(path, b'x' * 200_000)\n"
            "except OSError as error:\n"
            "    print(error.errno, error.filename)\n"
            "print(open(path).read(), sorted(os.listdir(sys.argv[1])))\n")
    result = subprocess.run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c",
         f"mount -t tmpfs -o size=64k none {shlex.quote(str(disk))} && "
         f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)} {shlex.quote(str(disk))}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [f"{errno.ENOSPC} {disk}/settings.json",
                                          "old ['settings.json']"]
