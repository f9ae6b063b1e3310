"""`pip install .`: the tfnmt package with its corpus, and the tfnmt-* commands."""
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile

from helpers import ROOT

COMMANDS = ("tfnmt-train", "tfnmt-export", "tfnmt-translate", "tfnmt-evaluate")


def run(*args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    return result


def test_pip_installs_the_package_its_corpus_and_commands(tmp_path):
    # Built from a copy (setuptools writes build/ beside the sources), without build isolation
    # and installed without dependencies: no download.
    source = tmp_path / "source"
    shutil.copytree(os.path.join(ROOT, "tfnmt"), source / "tfnmt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "-w", str(tmp_path / "wheels"), str(source))
    [wheel] = os.listdir(tmp_path / "wheels")
    with zipfile.ZipFile(tmp_path / "wheels" / wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt")))
    assert {f"tfnmt/data/de-en/{split}.tsv.gz" for split in ("train", "dev", "test")} <= set(names)
    assert "tfnmt/programs/train.py" in names and not [n for n in names if "tests/" in n]
    for command in COMMANDS:
        assert f"{command} = tfnmt.programs." in entry_points.decode()

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    # The venv sees this Python's packages (TensorFlow...) after its own, also where the suite
    # runs in a virtualenv, whose packages a venv made from it with --system-site-packages
    # would not see.
    outer = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE
                                      else [])
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    with open(os.path.join(purelib, "outer_packages.pth"), "w") as pth:
        pth.write("".join(f"{path}\n" for path in outer))
    run(str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index",
        str(tmp_path / "wheels" / wheel))
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    # Outside the checkout: the installed package, with the corpus inside it.
    where = run(str(venv / "bin" / "python"), "-c",
                "import os, tfnmt.paths as p; print(p.EMBEDDED_DIR); "
                "print(os.path.exists(os.path.join(p.EMBEDDED_DIR, 'train.tsv.gz')))",
                cwd=str(tmp_path), env=environment).stdout.split()
    assert where[0].startswith(str(venv)) and where[1] == "True"
    helped = subprocess.run([str(venv / "bin" / "tfnmt-translate"), "--help"],
                            capture_output=True, text=True, cwd=str(tmp_path),
                            env=environment, timeout=300)  # absl exits 1 after help
    # The program's flags listed, each with its help (not only the description's examples).
    assert "Translate text with a trained model" in helped.stdout, helped.stderr[-3000:]
    assert "\n  --n_best: " in helped.stdout
    error = subprocess.run([str(venv / "bin" / "tfnmt-train"), "--batch_tokens=-1"],
                           capture_output=True, text=True, cwd=str(tmp_path), env=environment,
                           timeout=300)
    assert error.returncode == 1
    assert error.stderr.strip().splitlines()[-1] == \
        "tfnmt-train: flag --batch_tokens=-1: --batch_tokens must be positive"
