"""Run as a subprocess by test_training.py: one train step on the same global batch under
OneDeviceStrategy and under MirroredStrategy over 2 logical CPUs; prints both as JSON."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfnmt.distribute import PreReducedAdam, split_cpu  # noqa: E402

split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfnmt.model import Transformer  # noqa: E402
from tfnmt.presets import get_preset  # noqa: E402
from tfnmt.schedule import paper_adam  # noqa: E402
from tfnmt.training import Trainer  # noqa: E402


def global_batch():
    rng = np.random.default_rng(0)
    source = rng.integers(4, 40, size=(4, 7)).astype("int32")
    target = rng.integers(4, 40, size=(4, 6)).astype("int32")
    target[0, 2:] = 0  # the two halves hold different numbers of real tokens
    target[1, 4:] = 0
    source[2, 3:] = 0
    target_in = np.concatenate([np.full((4, 1), 2, "int32"), target[:, :-1]], 1)
    target_in[target == 0] = 0
    return {"source": source, "target_in": target_in, "target_out": target}


def one_step(strategy, weights):
    with strategy.scope():
        model = Transformer(vocab_size=40, **get_preset("tiny", dropout=0.0))
        model.build()
        model.set_weights(weights)
        optimizer = paper_adam(model.d_model, 10, 1.0, PreReducedAdam)
        optimizer.build(model.trainable_variables)
    trainer = Trainer(model, optimizer, strategy, label_smoothing=0.1)
    dataset = tf.data.Dataset.from_tensors(global_batch()).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def gradients(iterator):
        out = strategy.run(trainer.replica_gradients, args=([next(iterator)],))
        return strategy.experimental_local_results(out[3])

    grads = [g.numpy().ravel() for g in gradients(iterator)[0]]
    metrics = {k: float(v) for k, v in trainer.train_step(iterator).items()}
    # After one Adam update: the weights, and how far each replica's copy is from the first's.
    copies = [[c.numpy() for c in strategy.experimental_local_results(v.value)]
              for v in model.trainable_variables]
    return {"metrics": metrics, "grads": np.concatenate(grads).tolist(),
            "weights": np.concatenate([c[0].ravel() for c in copies]).tolist(),
            "replica_spread": max(float(np.abs(c - cs[0]).max()) for cs in copies for c in cs),
            "replicas": strategy.num_replicas_in_sync}


def main():
    keras.utils.set_random_seed(0)
    reference = Transformer(vocab_size=40, **get_preset("tiny", dropout=0.0))
    reference.build()
    weights = reference.get_weights()
    single = one_step(tf.distribute.OneDeviceStrategy("/cpu:0"), weights)
    mirrored = one_step(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), weights)
    print(json.dumps({"single": single, "mirrored": mirrored}))


if __name__ == "__main__":
    main()
