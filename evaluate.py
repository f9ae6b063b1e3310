"""Score translations with sacreBLEU: BLEU, chrF and TER, each with its signature.

`python evaluate.py --help` lists its flags; the code is tfnmt/programs/evaluate.py. Installed
with `pip install .`, the same program is `tfnmt-evaluate`.
"""
from tfnmt.programs.evaluate import run

if __name__ == "__main__":
    run()
