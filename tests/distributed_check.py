"""Run as a subprocess by test_training.py, over 2 logical CPUs; prints JSON.

  distributed_check.py           one train step on the same global batch under
                                 OneDeviceStrategy and MirroredStrategy, and under
                                 MirroredStrategy with XLA (jit_compile)
  distributed_check.py matrix    for every model flag combination (post-/pre-norm, sinusoidal/
                                 learned positions, shared/separate embeddings): the training
                                 gradients on 2 replicas with 2 micro-batches each (and, with
                                 every flag on, also on 1 device and with 1 micro-batch) against
                                 plain autodiff of the per-token mean loss; and two replicas'
                                 losses on the same batch with dropout 0.3
"""
import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's compilation of the tiny model's step at LLVM's lowest optimisation level: the same
# HLO, results within the test's tolerances, compiled in 8 s instead of 46 (Zen 4 EPYC).
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

from tfnmt.training.distribute import (PreReducedAdam, batch_iterator,  # noqa: E402
                                      first_difference, split_cpu)

split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfnmt.model.presets import get_preset  # noqa: E402
from tfnmt.model.transformer import Transformer  # noqa: E402
from tfnmt.training.experiment import _check_one_model  # noqa: E402
from tfnmt.training.schedule import paper_adam  # noqa: E402
from tfnmt.training.trainer import Trainer, TrainingError  # noqa: E402


def tiny(**overrides):
    """The tiny preset with one layer a side: what is checked here is how the strategies
    split, reduce and accumulate, the same for any depth (test_model.py stacks layers)."""
    return get_preset("tiny", num_layers=1, **overrides)


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


def one_step(strategy, weights, jit_compile=False):
    with strategy.scope():
        model = Transformer(vocab_size=40, **tiny(dropout=0.0))
        model.build()
        model.set_weights(weights)
        optimizer = paper_adam(model.d_model, 10, 1.0, PreReducedAdam)
        optimizer.build(model.trainable_variables)
    trainer = Trainer(model, optimizer, strategy, label_smoothing=0.1, jit_compile=jit_compile)
    dataset = tf.data.Dataset.from_tensors(global_batch()).repeat()
    # One device reads the global batch as train.py reads its batches (a plain tf.data
    # iterator); two replicas get halves of it through tf.distribute.
    iterator = batch_iterator(strategy, lambda _: dataset) \
        if strategy.num_replicas_in_sync == 1 else \
        iter(strategy.experimental_distribute_dataset(dataset))

    metrics = {k: float(v) for k, v in trainer.train_step(iterator).items()}
    # After one Adam update: the weights, and how far each replica's copy is from the first's.
    copies = [[c.numpy() for c in strategy.experimental_local_results(v.value)]
              for v in model.trainable_variables]
    # Adam's moments after the update: (1 - beta) * g and (1 - beta2) * g^2 of the gradient
    # it was given. PreReducedAdam must be given the once-reduced sum (a second all-reduce
    # inside Keras would double them on 2 replicas; Adam's step itself would hide it).
    moments = [v.numpy().ravel() for v in optimizer.variables
               if "momentum" in v.path or "velocity" in v.path]
    # The gradient the update was given, from its first moment (no second pass of the model,
    # which with XLA would be a second compilation).
    first_moments = [v for v in optimizer.variables if "momentum" in v.path]
    assert [m.shape for m in first_moments] == [v.shape for v in model.trainable_variables]
    grads = [m.numpy().ravel() / (1.0 - optimizer.beta_1) for m in first_moments]
    # The end-of-run check: nothing after the update; then replica 1's copy of a weight, and
    # of an Adam moment, one ulp off (each put back after), found and named in the error.
    variables = model.weights + optimizer.variables
    differences, perturbed, errors = [first_difference(strategy, variables)], [], []
    if strategy.num_replicas_in_sync > 1:
        for variable in (model.trainable_variables[3], first_moments[-1]):
            first, second = strategy.experimental_local_results(variable.value)
            value = second.numpy()
            value.flat[0] = np.nextafter(value.flat[0], np.float32(np.inf))
            second.assign(value)
            try:
                _check_one_model(strategy, model, optimizer, step=1)
            except TrainingError as error:
                errors.append(str(error))
            second.assign(first)
            perturbed.append(variable.path)
        differences.append(first_difference(strategy, variables))
    return {"metrics": metrics, "grads": np.concatenate(grads).tolist(),
            "differences": differences, "perturbed": perturbed, "errors": errors,
            "moments": np.concatenate(moments).tolist(),
            "weights": np.concatenate([c[0].ravel() for c in copies]).tolist(),
            "replica_spread": max(float(np.abs(c - cs[0]).max()) for cs in copies for c in cs),
            "replicas": strategy.num_replicas_in_sync}


def reference_gradients(model, batch, epsilon=0.1):
    """Plain autodiff of the per-token mean label-smoothed cross-entropy, written out here:
    q puts 1 - epsilon on the label and epsilon / (V - 2) on every token but it and PAD (0);
    inference-mode layers (no custom gradients); dense gradients."""
    with tf.GradientTape() as tape:
        logits = model((batch["source"], batch["target_in"]), training=False)  # [B, T, V]
        vocab = logits.shape[-1]
        labels = tf.one_hot(batch["target_out"], vocab)
        others = 1.0 - labels - tf.one_hot(tf.zeros_like(batch["target_out"]), vocab)
        q = (1.0 - epsilon) * labels + epsilon / (vocab - 2) * others
        per_token = -tf.reduce_sum(q * tf.nn.log_softmax(logits), axis=-1)  # [B, T]
        real = tf.cast(batch["target_out"] != 0, tf.float32)
        loss = tf.reduce_sum(per_token * real) / tf.reduce_sum(real)
    return [tf.convert_to_tensor(g).numpy() for g in
            tape.gradient(loss, model.trainable_variables)]


def trainer_gradients(strategy, model, batch, micro_batches):
    """The training loop's gradients of `batch` split over the strategy's replicas and
    `micro_batches` micro-batches per replica (rows in order)."""
    trainer = Trainer(model, paper_adam(model.d_model, 10, 1.0, PreReducedAdam), strategy)
    replicas = strategy.num_replicas_in_sync
    rows = batch["source"].shape[0] // (replicas * micro_batches)

    def replica_batches(context):
        first = context.replica_id_in_sync_group * micro_batches
        return [{k: v[(first + m) * rows:(first + m + 1) * rows] for k, v in batch.items()}
                for m in range(micro_batches)]

    return [g[0].numpy() for g in run_replicas(strategy, trainer, replica_batches, 3)]


def run_replicas(strategy, trainer, replica_batches, output):
    """Output `output` of trainer.replica_gradients on each replica's micro-batches
    (replica_batches(context) -> list of batches): per tensor, the tuple of every replica's
    value."""
    # Eagerly (strategy.run works without tf.function): the same ops and gradients, without a
    # trace per model and strategy (4x faster here); the compiled step is checked by main().
    def run(values):
        out = strategy.run(trainer.replica_gradients, args=(values,))[output]
        return tf.nest.map_structure(lambda t: strategy.experimental_local_results(t), out)

    return run(strategy.experimental_distribute_values_from_function(replica_batches))


def matrix():
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    single = tf.distribute.OneDeviceStrategy("/cpu:0")
    batch = global_batch()
    results = []
    for norm_first in (False, True):
        for position in ("sinusoidal", "learned"):
            for share in (True, False):
                settings = dict(tiny(dropout=0.0), vocab_size=40, max_length=16,
                                norm_first=norm_first, position=position,
                                share_embeddings=share)
                keras.utils.set_random_seed(1)
                reference_model = Transformer(**settings)
                reference_model.build()
                weights = reference_model.get_weights()
                reference = reference_gradients(reference_model, batch)
                # Two replicas with two micro-batches each (all-reduce and accumulation)
                # for every combination; the other three ways for the one with every flag.
                ways = [("2_replicas", 2)]
                if norm_first and position == "learned" and not share:
                    ways += [("1_device", 1), ("1_device", 2), ("2_replicas", 1)]
                errors = {}
                for name, micro_batches in ways:
                    strategy = mirrored if name == "2_replicas" else single
                    with strategy.scope():
                        model = Transformer(**settings)
                        model.build()
                        model.set_weights(weights)
                    grads = trainer_gradients(strategy, model, batch, micro_batches)
                    errors[f"{name}_accum_{micro_batches}"] = max(
                        float(np.abs(g - r).max()) for g, r in zip(grads, reference))
                results.append({"settings": {"norm_first": norm_first, "position": position,
                                             "share_embeddings": share},
                                "largest_gradient": max(float(np.abs(r).max())
                                                        for r in reference),
                                "errors": errors})
    # Two replicas fed the same batch, dropout 0.3: each must drop its own elements.
    with mirrored.scope():
        model = Transformer(**dict(tiny(dropout=0.3), vocab_size=40))
        model.build()
    trainer = Trainer(model, paper_adam(model.d_model, 10, 1.0, PreReducedAdam), mirrored)
    losses = run_replicas(mirrored, trainer, lambda context: [batch], 0)
    return {"matrix": results, "dropout_replica_losses": [float(x) for x in losses]}


def main():
    if sys.argv[1:] == ["matrix"]:
        print(json.dumps(matrix()))
        return
    keras.utils.set_random_seed(0)
    reference = Transformer(vocab_size=40, **tiny(dropout=0.0))
    reference.build()
    weights = reference.get_weights()
    single = one_step(tf.distribute.OneDeviceStrategy("/cpu:0"), weights)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print(json.dumps({"single": single, "mirrored": one_step(mirrored, weights),
                      "mirrored_xla": one_step(mirrored, weights, jit_compile=True)}))


if __name__ == "__main__":
    main()
    # As the entry points (tfnmt/cli.py): the interpreter's teardown then skips collecting
    # the objects of every traced graph (1.5 s of this script's exit on the AMX Xeon).
    gc.freeze()
