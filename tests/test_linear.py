import numpy as np
import pytest
import tensorflow as tf

from tfnmt.layers.linear import (concatenated_kernels, kept_copies, linear, linear_many,
                                 linear_slices, low_precision_matmuls, pretransposed_kernels,
                                 slice_bounds, sliced_kernels)


def test_matches_batched_matmul_and_its_gradients():
    x = tf.random.normal([3, 5, 8])
    kernel = tf.random.normal([8, 6])
    bias = tf.random.normal([6])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, kernel, bias])
        ours = linear(x, kernel, bias)
        theirs = tf.matmul(x, kernel) + bias
        ours_sum, theirs_sum = tf.reduce_sum(ours ** 2), tf.reduce_sum(theirs ** 2)
    assert ours.shape == (3, 5, 6)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    for ours_grad, theirs_grad in zip(tape.gradient(ours_sum, [x, kernel, bias]),
                                      tape.gradient(theirs_sum, [x, kernel, bias])):
        np.testing.assert_allclose(ours_grad, theirs_grad, rtol=1e-5, atol=1e-4)


def test_transposed_kernel_and_compute_dtype():
    x = tf.cast(tf.random.normal([2, 4]), tf.bfloat16)
    embeddings = tf.random.normal([7, 4])  # [V, D], as the tied softmax uses it
    out = linear(x, embeddings, transpose_kernel=True)
    assert out.dtype == tf.bfloat16 and out.shape == (2, 7)
    np.testing.assert_allclose(tf.cast(out, tf.float32),
                               tf.cast(x, tf.float32) @ tf.transpose(tf.cast(
                                   tf.cast(embeddings, tf.bfloat16), tf.float32)), rtol=2e-2,
                               atol=2e-2)


def test_unknown_leading_dimensions_keep_static_width():
    @tf.function(input_signature=[tf.TensorSpec([None, None, 8])])
    def project(x):
        y = linear(x, tf.ones([8, 3]))
        assert y.shape.as_list() == [None, None, 3]
        return y

    assert project(tf.ones([2, 5, 8])).shape == (2, 5, 3)


@pytest.mark.parametrize("activation", [None, tf.nn.relu])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_training_path_equals_plain_ops_and_their_gradients(activation, dtype):
    # training=True takes the custom gradient (bias gradient as a GEMM by a row of ones).
    x = tf.cast(tf.random.normal([3, 5, 8]), dtype)
    kernel = tf.random.normal([8, 6])
    bias = tf.random.normal([6])
    upstream = tf.cast(tf.random.normal([3, 5, 6]), dtype)
    results = []
    for training in (True, False):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel, bias])
            y = linear(x, kernel, bias, activation=activation, training=training)
            total = tf.reduce_sum(tf.cast(y * upstream, tf.float32))
        results.append([y] + tape.gradient(total, [x, kernel, bias]))
    tolerance = 1e-5 if dtype == tf.float32 else 2e-2
    for ours, plain in zip(*results):
        np.testing.assert_allclose(tf.cast(ours, tf.float32), tf.cast(plain, tf.float32),
                                   rtol=tolerance, atol=tolerance * 10)
    if activation is not None:  # some outputs were clipped, so ReluGrad's mask mattered
        assert 0 < float(tf.reduce_mean(tf.cast(results[1][0] == 0, tf.float32))) < 1


def test_plain_ops_outside_training():
    # Inference graphs (and exports) keep MatMul + BiasAdd + Relu, which grappler fuses.
    @tf.function
    def project(x, training):
        return linear(x, tf.ones([8, 3]), tf.zeros([3]), activation=tf.nn.relu,
                      training=training)

    def op_types(training):
        graph = project.get_concrete_function(tf.TensorSpec([None, 8]), training).graph
        return {op.type for op in graph.get_operations()}

    assert "IdentityN" not in op_types(False) and "Relu" in op_types(False)
    assert "IdentityN" in op_types(True)


def test_low_precision_matmuls_round_input_kernel_and_product_only():
    x = tf.random.normal([2, 3, 8])
    kernel, other = tf.Variable(tf.random.normal([8, 6])), tf.Variable(tf.random.normal([8, 6]))
    bias = tf.random.normal([6])

    def bf16_product(k):  # rounded input x rounded kernel, the product rounded; rest float32
        product = tf.matmul(tf.cast(tf.reshape(x, [6, 8]), tf.bfloat16), tf.cast(k, tf.bfloat16))
        return tf.cast(product, tf.float32)

    plain = linear(x, kernel, bias, activation=tf.nn.relu)
    with low_precision_matmuls([kernel]):
        low = linear(x, kernel, bias, activation=tf.nn.relu)
        assert low.dtype == tf.float32 and low.shape == (2, 3, 6)
        np.testing.assert_array_equal(
            low, tf.reshape(tf.nn.relu(bf16_product(kernel) + bias), [2, 3, 6]))
        assert not np.array_equal(low, plain)
        # Training, and kernels not named, keep the float32 product.
        np.testing.assert_array_equal(linear(x, kernel, bias, activation=tf.nn.relu,
                                             training=True), plain)
        np.testing.assert_array_equal(linear(x, other), linear(x, tf.convert_to_tensor(other)))
        with low_precision_matmuls([other]):  # nested: both kernels
            np.testing.assert_array_equal(linear(x, other),
                                          tf.reshape(bf16_product(other), [2, 3, 6]))
            np.testing.assert_array_equal(linear(x, kernel, bias, activation=tf.nn.relu), low)
        np.testing.assert_array_equal(  # inner scope gone
            linear(x, other), tf.reshape(tf.reshape(x, [6, 8]) @ other, [2, 3, 6]))
    np.testing.assert_array_equal(linear(x, kernel, bias, activation=tf.nn.relu), plain)


def test_low_precision_kernels_are_cast_once_before_a_loop():
    kernel = tf.Variable(tf.random.normal([8, 8]))

    @tf.function
    def iterate(x):
        with low_precision_matmuls([kernel]):
            return tf.while_loop(lambda i, x: i < 3,
                                 lambda i, x: (i + 1, tf.tanh(linear(x, kernel))), (0, x))[1]

    x = tf.random.normal([4, 8])
    expected = x
    for _ in range(3):
        expected = tf.tanh(tf.cast(tf.matmul(tf.cast(expected, tf.bfloat16),
                                             tf.cast(kernel, tf.bfloat16)), tf.float32))
    np.testing.assert_array_equal(iterate(x), expected)
    graph_def = iterate.get_concrete_function(x).graph.as_graph_def()
    body = next(f for f in graph_def.library.function if "body" in f.signature.name)
    # In the loop: the input's cast to bf16 and the product's back, no cast of the kernel.
    assert sorted(node.attr["DstT"].type for node in body.node_def if node.op == "Cast") == \
        sorted([tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum])
    assert not [node for node in body.node_def if node.op == "ReadVariableOp"]


def test_pretransposed_kernels_multiply_by_a_copy_made_once_before_a_loop():
    embedding = tf.Variable(tf.random.normal([12, 8]))  # [V, D], the tied output layer's
    x = tf.random.normal([2, 3, 8])
    expected = np.einsum("btd,vd->btv", x.numpy().astype(np.float64),
                         embedding.numpy().astype(np.float64))
    with pretransposed_kernels([embedding]):
        np.testing.assert_allclose(linear(x, embedding, transpose_kernel=True), expected,
                                   rtol=1e-5, atol=1e-5)
        # Training, and products with the kernel untransposed, are left alone.
        np.testing.assert_array_equal(linear(x, embedding, transpose_kernel=True, training=True),
                                      linear(x, tf.convert_to_tensor(embedding),
                                             transpose_kernel=True, training=True))
    with low_precision_matmuls([embedding]):  # the bf16 copy is the one transposed
        with pretransposed_kernels([embedding]):
            low = linear(x, embedding, transpose_kernel=True)
        rounded = tf.matmul(tf.cast(tf.reshape(x, [6, 8]), tf.bfloat16),
                            tf.transpose(tf.cast(embedding, tf.bfloat16)))
        np.testing.assert_array_equal(low, tf.reshape(tf.cast(rounded, tf.float32), [2, 3, 12]))

    @tf.function
    def iterate(x):  # [4, 8]: x <- tanh(x Eᵀ)[:, :8], three times
        with pretransposed_kernels([embedding]):
            return tf.while_loop(
                lambda i, x: i < 3,
                lambda i, x: (i + 1, tf.tanh(linear(x, embedding, transpose_kernel=True))[:, :8]),
                (0, x))[1]

    start = tf.random.normal([4, 8])
    reference = start.numpy().astype(np.float64)
    for _ in range(3):
        reference = np.tanh(reference @ embedding.numpy().astype(np.float64).T)[:, :8]
    np.testing.assert_allclose(iterate(start), reference, rtol=1e-5, atol=1e-5)
    graph_def = iterate.get_concrete_function(start).graph.as_graph_def()
    body = next(f for f in graph_def.library.function if "body" in f.signature.name)
    # In the loop: one product by the copy, no transpose and no variable read.
    products = [node for node in body.node_def if node.op == "MatMul"]
    assert len(products) == 1 and not products[0].attr["transpose_b"].b
    assert not [node for node in body.node_def if node.op in ("Transpose", "ReadVariableOp")]

    @tf.function
    def nested(x):  # an inner function inside an enclosing scope uses the enclosing copy
        with pretransposed_kernels([embedding]):
            inner = tf.function(lambda x: iterate.python_function(x), autograph=False)
            return inner(x)

    np.testing.assert_allclose(nested(start), reference, rtol=1e-5, atol=1e-5)
    graph_def = nested.get_concrete_function(start).graph.as_graph_def()
    assert sum(node.op == "Transpose" for node in graph_def.node) == 1
    assert not [node for f in graph_def.library.function for node in f.node_def
                if node.op == "Transpose"]


def test_concatenated_kernels_make_one_product_of_a_group():
    kernels = [tf.Variable(tf.random.normal([8, width])) for width in (8, 4, 8)]
    biases = [tf.Variable(tf.random.normal([width])) for width in (8, 4, 8)]
    x = tf.random.normal([5, 1, 8])
    expected = [x.numpy().astype(np.float64) @ k.numpy() + b.numpy()
                for k, b in zip(kernels, biases)]

    @tf.function
    def project(x):
        with concatenated_kernels([(kernels, biases)]):
            return linear_many(x, kernels, biases)

    for out, reference in zip(project(x), expected):
        assert out.shape == reference.shape
        np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)
    graph = project.get_concrete_function(x).graph
    assert sum(op.type == "MatMul" for op in graph.get_operations()) == 1
    # Without the scope, or with another group, or in training: one product per kernel.
    for out, reference in zip(linear_many(x, kernels, biases), expected):
        np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)
    with concatenated_kernels([(kernels[:2], biases[:2])]):
        graph = tf.function(lambda x: linear_many(x, kernels, biases)).get_concrete_function(
            x).graph
        assert sum(op.type == "MatMul" for op in graph.get_operations()) == 3
        graph = tf.function(lambda x: linear_many(x, kernels[:2], biases[:2], training=True)
                            ).get_concrete_function(x).graph
        assert sum(op.type == "MatMul" for op in graph.get_operations()) == 2

    # Inside `low_precision_matmuls` the group's bf16 copies are the ones side by side: the
    # inputs, kernels and products rounded to bf16 as `linear` rounds them.
    @tf.function
    def project_low(x):
        with low_precision_matmuls(kernels), concatenated_kernels([(kernels, biases)]):
            return linear_many(x, kernels, biases)

    for out, kernel, bias in zip(project_low(x), kernels, biases):
        rounded = tf.matmul(tf.cast(tf.reshape(x, [5, 8]), tf.bfloat16),
                            tf.cast(kernel, tf.bfloat16))
        np.testing.assert_allclose(out, tf.cast(rounded, tf.float32)[:, None] + bias,
                                   rtol=1e-2, atol=1e-2)
    products = [op for op in project_low.get_concrete_function(x).graph.get_operations()
                if op.type == "MatMul"]
    assert len(products) == 1 and products[0].get_attr("T") == tf.bfloat16


@pytest.mark.parametrize("width", [1, 31, 32, 33, 600, 8000, 37001])
@pytest.mark.parametrize("slices", [1, 2, 3])
def test_slice_bounds_cover_the_width_in_whole_chunks(width, slices):
    bounds = slice_bounds(width, slices)
    assert bounds[0] == 0 and bounds[-1] == width and len(bounds) <= slices + 1
    assert all(a < b for a, b in zip(bounds, bounds[1:]))  # none empty
    assert all(b % 32 == 0 for b in bounds[1:-1])
    if width >= 64 * slices:  # about equal: within a chunk of width / slices
        assert max(b - a for a, b in zip(bounds, bounds[1:])) - width / slices < 32


@pytest.mark.parametrize("transpose", [True, False])
def test_sliced_kernels_give_the_product_in_column_blocks_made_once(transpose):
    # A tied output layer ([V, D] embedding, transposed) and an untied one ([D, V]); 70
    # columns in blocks of 64 and 6 (slice_bounds), checked against float64 numpy.
    kernel = tf.Variable(tf.random.normal([70, 8] if transpose else [8, 70]))
    x = tf.random.normal([2, 3, 8])
    dense = kernel.numpy().astype(np.float64)
    expected = x.numpy().astype(np.float64) @ (dense.T if transpose else dense)  # [2, 3, 70]
    assert len(linear_slices(x, kernel, transpose_kernel=transpose)) == 1  # outside the scope

    @tf.function
    def iterate(x):  # [4, 8]: x <- tanh(x K)[:, :8] three times, the blocks concatenated
        with sliced_kernels([kernel], 2, transpose=transpose):
            def step(i, x):
                parts = linear_slices(x, kernel, transpose_kernel=transpose)
                return i + 1, tf.tanh(tf.concat(parts, axis=1))[:, :8]
            return tf.while_loop(lambda i, x: i < 3, step, (0, x))[1]

    with sliced_kernels([kernel], 2, transpose=transpose):
        parts = linear_slices(x, kernel, transpose_kernel=transpose)
    assert [p.shape for p in parts] == [(2, 3, 64), (2, 3, 6)]
    np.testing.assert_allclose(tf.concat(parts, axis=-1), expected, rtol=1e-5, atol=1e-5)
    start = tf.random.normal([4, 8])
    reference = start.numpy().astype(np.float64)
    for _ in range(3):
        reference = np.tanh(reference @ (dense.T if transpose else dense))[:, :8]
    np.testing.assert_allclose(iterate(start), reference, rtol=1e-5, atol=1e-5)
    graph_def = iterate.get_concrete_function(start).graph.as_graph_def()
    body = next(f for f in graph_def.library.function if "body" in f.signature.name)
    # In the loop: one product per block, by copies made before it.
    products = [node for node in body.node_def if node.op == "MatMul"]
    assert len(products) == 2 and not any(p.attr["transpose_b"].b for p in products)
    kinds = [node.op for node in body.node_def]
    assert kinds.count("StridedSlice") == 1  # the step's own [:, :8]
    assert not {"Transpose", "ReadVariableOp", "Slice"} & set(kinds)

    # Inside `low_precision_matmuls` the blocks are the bf16 copy's: input, kernel and product
    # rounded as `linear` rounds them.
    with low_precision_matmuls([kernel]), sliced_kernels([kernel], 2, transpose=transpose):
        low = linear_slices(x, kernel, transpose_kernel=transpose)
    rounded = tf.matmul(tf.cast(tf.reshape(x, [6, 8]), tf.bfloat16), tf.cast(kernel, tf.bfloat16),
                        transpose_b=transpose)
    np.testing.assert_array_equal(tf.concat(low, axis=-1),
                                  tf.reshape(tf.cast(rounded, tf.float32), [2, 3, 70]))


def _product_dtypes(function, *args):
    return sorted(op.get_attr("T").name for op in
                  tf.function(function).get_concrete_function(*args).graph.get_operations()
                  if op.type == "MatMul")


def test_an_enclosing_copy_in_another_precision_does_not_serve():
    # A float32 scope's copies do not serve a low-precision scope inside it: the inner scope
    # multiplies in its own precision.
    kernel = tf.Variable(tf.random.normal([70, 8]))  # [V, D], transposed as a tied output layer
    group = [tf.Variable(tf.random.normal([8, 8])) for _ in range(2)]
    biases = [tf.Variable(tf.zeros([8])) for _ in range(2)]
    x = tf.random.normal([3, 8])
    scopes = {
        "pretransposed": (lambda: pretransposed_kernels([kernel]),
                          lambda x: [linear(x, kernel, transpose_kernel=True)]),
        "sliced": (lambda: sliced_kernels([kernel], 2, transpose=True),
                   lambda x: linear_slices(x, kernel, transpose_kernel=True)),
        "concatenated": (lambda: concatenated_kernels([(group, biases)]),
                         lambda x: linear_many(x, group, biases)),
    }
    for name, (scope, products) in scopes.items():
        def inner_low(x):
            with scope(), low_precision_matmuls([kernel] + group), scope():
                return products(x)

        assert set(_product_dtypes(inner_low, x)) == {"bfloat16"}, name
        rounded = [tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(k, tf.bfloat16),
                                     transpose_b=k is kernel), tf.float32)
                   for k in ([kernel] if name != "concatenated" else group)]
        np.testing.assert_array_equal(tf.concat(tf.function(inner_low)(x), axis=-1),
                                      tf.concat(rounded, axis=-1), err_msg=name)


def test_a_group_partly_in_low_precision_stays_float32():
    group = [tf.Variable(tf.random.normal([8, width])) for width in (8, 4)]
    biases = [tf.Variable(tf.random.normal([width])) for width in (8, 4)]
    x = tf.random.normal([3, 8])

    def project(x):
        with low_precision_matmuls(group[:1]), concatenated_kernels([(group, biases)]):
            return linear_many(x, group, biases)

    assert _product_dtypes(project, x) == ["float32"]  # one product, in float32
    for out, kernel, bias in zip(tf.function(project)(x), group, biases):
        np.testing.assert_allclose(out, x.numpy().astype(np.float64) @ kernel.numpy()
                                   + bias.numpy(), rtol=1e-5, atol=1e-5)


def test_kept_copies_are_made_once_and_given_the_weights_again_eagerly():
    kernel = tf.Variable(tf.random.normal([6, 4]))  # [V, D]
    x = tf.random.normal([2, 4])
    copies = {}
    with kept_copies(copies), pretransposed_kernels([kernel]):
        pass  # eagerly: makes the copy
    (key, copy), = copies.items()
    np.testing.assert_array_equal(copy, kernel.numpy().T)
    kernel.assign(kernel * 2)
    with kept_copies(copies), pretransposed_kernels([kernel]):
        assert copies == {key: copy}  # the same variable, given the new weights
        np.testing.assert_array_equal(copy, kernel.numpy().T)

    @tf.function
    def project(x):  # traced: reads the kept variable, makes no transpose
        with kept_copies(copies), pretransposed_kernels([kernel]):
            return linear(x, kernel, transpose_kernel=True)

    np.testing.assert_allclose(project(x), x.numpy() @ kernel.numpy().T, rtol=1e-5, atol=1e-5)
    graph = project.get_concrete_function(x).graph
    assert not [op for op in graph.get_operations() if op.type == "Transpose"]


def test_an_empty_inner_axis():
    out = linear(tf.zeros([2, 0, 4]), tf.ones([4, 3]), tf.ones([3]))
    assert out.shape == (2, 0, 3)
