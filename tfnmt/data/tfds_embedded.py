"""The embedded corpus as a TFDS builder (`tfnmt_de_en`), so it loads like any TFDS dataset:

    import tfnmt.data.tfds_embedded, tensorflow_datasets as tfds
    ds = tfds.load("tfnmt_de_en", split="validation", as_supervised=True)

It reads tfnmt/data/de-en/*.tsv.gz from this repository (`corpus.read_embedded`, which tfnmt's
programs read them with): preparing it downloads nothing.
"""
import tensorflow_datasets as tfds

from tfnmt.data.corpus import read_embedded


class TfnmtDeEn(tfds.core.GeneratorBasedBuilder):
    """German->English: Schlachter 1951 / World English Bible verses and Ding example sentences."""

    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {"1.0.0": "Bible (Schlachter 1951 -> WEB) + Ding sentence pairs.",
                     "1.1.0": "Keeps the order of tfnmt/data/de-en (no shuffling)."}
    LOCAL = True  # nothing to download: tfnmt.data.corpus skips its network check

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.Translation(languages=("de", "en")),
            supervised_keys=("de", "en"),
            disable_shuffling=True,  # file order: dev/test read in the order of tfnmt/data/de-en
            homepage="https://github.com/ (tfnmt, data/README.md)",
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {tfds_split: self._generate_examples(split)
                for split, tfds_split in (("train", "train"), ("dev", "validation"),
                                          ("test", "test"))}

    def _generate_examples(self, split):
        for index, (german, english) in enumerate(read_embedded(split)):
            yield index, {"de": german, "en": english}
