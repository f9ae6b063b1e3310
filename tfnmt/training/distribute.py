"""Choosing a tf.distribute strategy, and the cluster role of this process."""
import keras
import tensorflow as tf

from tfnmt.training import cluster


def split_cpu(num_devices):
    """Exposes the CPU as several logical devices (mirrored training without GPUs, e.g. in tests).
    Must run before TensorFlow initialises its devices.

    Args:
      num_devices: the number of logical CPUs (1: leave the CPU as it is).
    """
    if num_devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])


def make_strategy(name="auto"):
    """The training strategy.

    Args:
      name: "auto" (multi_worker when TF_CONFIG names several workers, mirrored with several
        GPUs, else one_device), "one_device" (the first GPU, else the CPU), "mirrored" (all
        local GPUs, or all logical CPUs when there is no GPU) or "multi_worker"
        (MultiWorkerMirroredStrategy over the cluster in TF_CONFIG).

    Returns:
      A `tf.distribute.Strategy`.

    Raises:
      ValueError: an unknown name.
      cluster.ClusterConfigError: multi_worker without a TF_CONFIG that places this process
        in its cluster.
    """
    # Physical devices only: listing logical ones starts the runtime, after which
    # MultiWorkerMirroredStrategy can no longer configure its collective ops.
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    if name in ("auto", "multi_worker"):
        config = cluster.read_tf_config()
    if name == "auto":
        name = ("multi_worker" if cluster.training_processes(config) > 1 else
                "mirrored" if num_gpus > 1 else "one_device")
    if name == "multi_worker":
        cluster.check_training_task(config)
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0] if gpus else "/cpu:0")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(
            gpus or [d.name for d in tf.config.list_logical_devices("CPU")])
    raise ValueError(f"unknown strategy {name!r}")


def batch_iterator(strategy, dataset_fn):
    """An iterator over each replica's training batches, for `Trainer`.

    One replica on the CPU reads its tf.data pipeline directly: tf.distribute's
    MultiDeviceIterator would only add a host buffer there, and deleting it at the end of a
    run was seen waiting up to 46 s for the tf.data autotuning thread of its per-device
    pipeline (which the pipeline's own options do not reach).

    Args:
      strategy: the training strategy.
      dataset_fn: `InputContext -> tf.data.Dataset` of one replica's batches.

    Returns:
      An iterator whose `next()` gives one update's batch for each replica.
    """
    devices = strategy.extended.worker_devices
    if isinstance(strategy, tf.distribute.OneDeviceStrategy) and \
            tf.DeviceSpec.from_string(devices[0]).device_type == "CPU":
        with tf.device(devices[0]):
            return iter(dataset_fn(tf.distribute.InputContext()))
    return iter(strategy.distribute_datasets_from_function(dataset_fn))


def task_role(strategy):
    """This process's role in its cluster.

    Args:
      strategy: the training strategy.

    Returns:
      (is_chief, task_id); a single process is the chief.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True, 0
    task_type, task_id = resolver.task_type, resolver.task_id or 0
    return task_type == "chief" or (task_type == "worker" and task_id == 0
                                    and "chief" not in resolver.cluster_spec().as_dict()), task_id


def first_difference(strategy, variables):
    """The first of `variables` whose copies differ between the strategy's replicas.

    Each replica sums the bit patterns of each variable's values (as integers, modulo 2^64):
    a changed element changes its sum (but for changes that cancel exactly), without the
    values leaving their replicas. Under multi_worker every process must call it (a
    collective gathers the sums).

    Args:
      strategy: the training strategy.
      variables: what each replica holds a copy of (the model's weights, the optimizer's).

    Returns:
      (the variable's path, the first replica whose copy is not replica 0's), or None when
      every replica holds the same numbers.
    """
    def checksums():
        sums = []
        for variable in variables:
            value = tf.convert_to_tensor(variable)
            if value.dtype.is_floating:  # its bits, so that -0.0, NaN or a last bit count
                value = tf.bitcast(value, {2: tf.int16, 4: tf.int32, 8: tf.int64}[value.dtype.size])
            sums.append(tf.reduce_sum(tf.cast(value, tf.int64)))
        return tf.stack(sums)[None]  # [1, N]

    @tf.function(autograph=False)  # strategy.run called eagerly logs a warning under mirrored
    def gathered():
        return strategy.gather(strategy.run(checksums), axis=0)

    table = gathered().numpy()  # [replicas, N]
    for replica in range(1, table.shape[0]):
        differing = (table[replica] != table[0]).nonzero()[0]
        if differing.size:
            variable = variables[differing[0]]
            return getattr(variable, "path", variable.name), replica
    return None


@keras.saving.register_keras_serializable(package="tfnmt")
class PreReducedAdam(keras.optimizers.Adam):
    """Adam for gradients that the training loop has already summed across replicas.

    Keras' TF optimizer all-reduces gradients inside apply_gradients. Our loop reduces them
    itself (once), because it needs the global gradient norm for TensorBoard; reducing again
    would multiply them by the replica count.
    """

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)

    def update_step(self, gradient, variable, learning_rate):
        """Keras' Adam update as TensorFlow's fused ResourceApplyAdam kernel: one pass over the
        weight, its moments and its gradient instead of Keras' ten elementwise ops (about 2.5×
        faster on a 2-core CPU, CHANGELOG.md). Same formula, epsilon outside the square root;
        the stock update with `fast_ops` off or with amsgrad.
        """
        from tfnmt import fast_ops
        if self.amsgrad or not fast_ops.enabled():
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        # Inside a strategy's update() the moments' handles are this device's copies.
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype), beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype))
