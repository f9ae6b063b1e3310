"""train.py's checks of the data it is given, each refusing in one line (app.UsageError)
before the run starts: --vocab models, their order and the training pairs' direction against
them, subword sampling against the vocabulary's type, dev and test files given the other way
round, pairs whose sources are their targets, and a side that holds no sentences (a TSV's id
column). They read a sample of the text with plain Python, before TensorFlow loads."""
import itertools
import os
import shlex
import re

from absl import app, flags

from tfnmt import text_lines

FLAGS = flags.FLAGS


def first_pairs(split, spec, reverse, sample):
    """The first `sample` pairs of a files corpus (`corpus.read_corpus`), or None where it does
    not read: preparing the data names the bad line."""
    from tfnmt.data.corpus import CorpusError, read_corpus

    try:
        return list(itertools.islice(read_corpus("files", split, spec, log_skipped=False,
                                                 reverse=reverse), sample))
    except CorpusError:
        return None


def check_vocab_given():
    """One line (app.UsageError) for a --vocab that cannot be used, or flags it leaves unused."""
    if len(FLAGS.vocab) > 2:
        raise app.UsageError("--vocab: one SentencePiece model (shared by both sides) or two "
                             f"(source,target), got {len(FLAGS.vocab)}")
    if FLAGS.init_from:
        raise app.UsageError("--vocab: a fine-tuned model keeps its source's vocabulary "
                             "(--init_from): drop --vocab")
    for name in ("vocab_size", "vocab_type"):
        if FLAGS[name].present:
            raise app.UsageError(f"--{name} is for a vocabulary learned on the training data, "
                                 f"and --vocab gives one: drop --{name}")
    if len(FLAGS.vocab) == 1 and FLAGS.separate_vocabularies:
        raise app.UsageError("--separate_vocabularies needs two --vocab models "
                             "(source.model,target.model)")
    if len(FLAGS.vocab) == 2 and FLAGS.share_embeddings:
        raise app.UsageError("--share_embeddings needs one shared vocabulary, and --vocab gives "
                             "two: drop --share_embeddings")
    from tfnmt.data.vocabulary import check_given_model

    for path in FLAGS.vocab:
        try:
            check_given_model(path)
        except ValueError as error:
            raise app.UsageError(f"--vocab: {error}")
    if len(FLAGS.vocab) == 2 and FLAGS.dataset == "files" and FLAGS.train_files:
        check_vocab_order()


def check_vocab_order(sample=1000):
    """One line (app.UsageError) for two --vocab models that look given the other way round
    (`vocabulary.swapped_side_models`), judged on the first training corpus' first `sample`
    pairs, before a run starts learning with them (a run under way keeps its models)."""
    source, target = FLAGS.vocab
    evidence = swapped_models_evidence(source, target, FLAGS.reverse, sample)
    if evidence:
        reverse = " (with --reverse the source is the second side of --train_files)" \
            if FLAGS.reverse else ""
        raise app.UsageError(f"--vocab={source},{target}: the models look given the other way "
                             f"round: the source side's comes first{reverse}, and {evidence}: "
                             f"give --vocab={target},{source}")


def check_fine_tuning_direction(settings, sample=1000):
    """One line (app.UsageError) for an --init_from model with separate vocabularies whose
    training pairs look read the other way round (each side tokenized by the other side's
    model, `vocabulary.swapped_side_models`), before a fine-tuning starts."""
    from tfnmt.data import vocabulary

    d = settings["data"]
    if not (settings.get("init_from") and d.get("separate_vocabularies")
            and FLAGS.dataset == "files"):
        return
    source, target = vocabulary.paths(settings["init_from"]["model_dir"], separate=True)
    evidence = swapped_models_evidence(source, target, d["reverse"], sample)
    if evidence:
        if not d["reverse"]:
            give = ("give --reverse (or --train_files and --dev_files with their sides the other "
                    "way round)")
        else:
            give = "drop --reverse" if FLAGS["reverse"].present else "give --noreverse"
        raise app.UsageError(f"--init_from={FLAGS.init_from}: the training pairs look read the "
                             f"other way round for its source and target vocabularies: "
                             f"{evidence}: {give}")


def check_held_out_order(settings, sample=1000):
    """One line (app.UsageError) for --dev_files or --test_files whose pairs look given the
    other way round from the training pairs (`side_order.swapped_sides`, on the first `sample`
    pairs of each and of the first training corpus)."""
    from tfnmt.data.corpus import train_specs
    from tfnmt.data.side_order import swapped_sides

    d = settings["data"]
    if d.get("dataset") != "files":
        return
    files, reverse = d.get("files") or {}, d.get("reverse", False)
    train = first_pairs("train", train_specs(files)[0], reverse, sample)
    for split in ("dev", "test"):
        pairs = first_pairs(split, files[split], reverse, sample) if files.get(split) else None
        evidence = swapped_sides(train, pairs) if train and pairs else None
        if evidence:
            spec = files[split]
            give = f"give --{split}_files={','.join(reversed(spec.split(',')))}" \
                if "," in spec else "swap the columns of its TSV"
            raise app.UsageError(
                f"--{split}_files={spec}: its pairs look given the other way round from the "
                "training pairs: their sources read like the training targets and their "
                "targets like the training sources (by how often each two adjacent "
                f"characters occur in the first {sample:,d} pairs of each): {give}")


def check_copied_sides(settings, sample=1000, share=0.95):
    """One line (app.UsageError) where the pairs' sources are their targets (in `share` of the
    first `sample` pairs or more): in every training corpus (the same file given for both
    sides, say), which trains a model to copy; or in the dev or test files, whose scores would
    measure copying. A copied corpus beside a translated one (a known help with monolingual
    target text) passes."""
    from tfnmt.data.corpus import train_specs

    d = settings["data"]
    if d.get("dataset") != "files":
        return
    files, reverse = d.get("files") or {}, d.get("reverse", False)

    def copied(split, spec):  # (pairs that are copies, pairs read), or None
        pairs = first_pairs(split, spec, reverse, sample)
        same = sum(source == target for source, target in pairs or ())
        return (same, len(pairs)) if pairs and same >= share * len(pairs) else None

    train = [copied("train", spec) for spec in train_specs(files)]
    if train and all(train):
        each = " of each corpus" if len(train) > 1 else ""
        raise app.UsageError(
            f"{' '.join(f'--train_files={spec}' for spec in train_specs(files))}: the pairs' "
            f"sources are their targets ({train[0][0]:,d} of the first {train[0][1]:,d} "
            f"pairs{each}): a model trained on them learns to copy: give the source and the "
            "target files (a copied corpus helps only beside translated ones)")
    for split in ("dev", "test"):
        found = copied(split, files[split]) if files.get(split) else None
        if found:
            raise app.UsageError(
                f"--{split}_files={files[split]}: the pairs' sources are their targets "
                f"({found[0]:,d} of the first {found[1]:,d} pairs): its scores would measure "
                "copying: give its source and target files")


URL = re.compile(r"[a-z][a-z0-9+.-]*://\S*", re.IGNORECASE)


def _not_text(line):
    """Whether a corpus line holds no sentence: a number or code with no letter, or a URL."""
    return not any(c.isalpha() for c in line) or URL.fullmatch(line) is not None


def check_text_sides(settings, sample=1000, share=0.95):
    """One line (app.UsageError) for a training, dev or test corpus one of whose sides holds no
    sentences (in `share` of its first `sample` pairs or more: numbers, ids or URLs), as a TSV
    whose first columns are an id and a sentence, or a score, gives: a model trained on it
    translates ids into sentences, and dev scores measure nothing."""
    from tfnmt.data.corpus import train_specs

    d = settings["data"]
    if d.get("dataset") != "files":
        return
    files, reverse = d.get("files") or {}, d.get("reverse", False)
    given = [("train", spec) for spec in train_specs(files)] + [
        (split, files[split]) for split in ("dev", "test") if files.get(split)]
    for split, spec in given:
        pairs = first_pairs(split, spec, False, sample) or []
        for column, side in enumerate(zip(*pairs)):
            found = sum(map(_not_text, side))
            if len(side) < 10 or found < share * len(side):
                continue
            role = ("target", "source")[column] if reverse else ("source", "target")[column]
            if "," in spec:
                where = f"{spec.split(',')[column]} (the {role} side) holds"
                advice = "give the files of the sentences"
            else:
                where = f"its column {column + 1} (the {role} side; a TSV's first two columns " \
                        "are the source and the target) holds"
                advice = _sentence_columns_advice(spec, split, sample, share)
            raise app.UsageError(
                f"--{split}_files={spec}: {where} no sentences: {found:,d} of the first "
                f"{len(side):,d} lines are numbers, ids or URLs: {advice}")


def _sentence_columns_advice(path, split, sample, share):
    """How to give the sentences of a TSV whose first two columns are not both sentences: the
    columns that hold them, cut into two files."""
    from tfnmt.data.corpus import CorpusError, tsv_rows

    try:
        rows = tsv_rows(path, sample)
    except CorpusError:
        rows = []
    width = min(map(len, rows), default=0)
    sentences = [c for c in range(width)
                 if sum(_not_text(row[c]) for row in rows) < (1 - share) * len(rows)]
    if len(sentences) != 2:
        return "give its two sentence columns as two files (cut -f<column>)"
    cuts, outputs = text_lines.column_cuts(path, [c + 1 for c in sentences])
    return (f"its sentences look to be in columns {sentences[0] + 1} and {sentences[1] + 1}: "
            f"{cuts}; then --{split}_files={shlex.quote(','.join(outputs))}")


def swapped_models_evidence(source, target, reverse, sample):
    """Where SentencePiece models `source` and `target` look given the other way round for the
    first training corpus' first `sample` pairs (read with `reverse`), the piece counts that
    show it, as words; else None (also before a run's first checkpoint: a run under way keeps
    its models)."""
    from tfnmt.data.vocabulary import swapped_side_models
    from tfnmt.paths import CHECKPOINTS, checkpoint_prefixes

    if FLAGS.model_dir and checkpoint_prefixes(os.path.join(FLAGS.model_dir, CHECKPOINTS)):
        return None
    pairs = first_pairs("train", FLAGS.train_files[0], reverse, sample)
    counts = swapped_side_models(source, target, pairs) if pairs else None
    if not counts:
        return None
    (source_own, source_other), (target_own, target_other) = (counts["source"],
                                                              counts["target"])
    return (f"the first {len(pairs):,d} training sources take {source_own:,d} pieces with "
            f"{source} but {source_other:,d} with {target}, the targets {target_own:,d} with "
            f"{target} but {target_other:,d} with {source}")


def check_subword_sampling(settings):
    """One line (app.UsageError) for a --subword_alpha that cannot sample from the vocabulary
    (`vocabulary.subword_sampling_error`), where --vocab or --vocab_type tell its type before
    TensorFlow loads; the run checks the vocabulary it loads again."""
    from tfnmt.data.vocabulary import model_type, subword_sampling_error

    alpha, d = settings["train"].get("subword_alpha"), settings["data"]
    if not alpha:
        return
    if FLAGS.vocab:
        types = {}
        for path in FLAGS.vocab:
            with open(path, "rb") as f:
                types[f"--vocab's {path}"] = model_type(f.read())
    else:
        flag = f"--vocab_type={d.get('vocab_type')}"
        where = flag if FLAGS["vocab_type"].present else f"the run's vocabulary ({flag})"
        types = {where: d["vocab_type"]} if d.get("vocab_type") else {}
    for where, kind in types.items():
        error = subword_sampling_error(kind, alpha)
        if error:
            raise app.UsageError(f"--subword_alpha={alpha:g}: {where}: {error}")
