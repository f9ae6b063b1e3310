"""Decoder self-attention keys/values for the incremental searches, written in place.

Appending each step's keys to a [rows, H, t, Dh] cache (a concat) copies the whole cache every
step, and reordering it for the beams (a gather) copies it again. Here each decoder layer keeps a
*store* [capacity * slots * H, Dh] per keys and values: the key of slot s (a row of the initial
search batch) at time tau and head h lives at row (tau * slots + s) * H + h. Each step writes
its new keys there in place (InplaceUpdate, a core op that aliases its input: no copy), and each
hypothesis reads its history with one gather through its *ancestry*, the slot that it, or the
hypothesis it extends, held at each earlier time. Reordering beams then moves the [rows, t]
int32 ancestry, never keys, and rows leaving the search leave the store as it is.

The gathered keys [rows, H, t + 1, Dh] are the very values the concat cache held, so the
attention, and every output, is unchanged.

In-place writes are safe because a store is only ever written by the step that owns it: it is
allocated inside the search (`grow`: a concat, a fresh buffer per call, never a folded
constant), and each step's write depends on the previous step's reads through the chosen
tokens.
"""
import tensorflow as tf

# Time steps a store holds when it is first allocated; it doubles when full (up to max_length).
INITIAL_CAPACITY = 16


def empty_stores(initial_cache):
    """For a model's initial_cache (self-attention keys/values [B, H, 0, Dh] per layer): the
    number of heads H, and one empty store {"key", "value"} [0, Dh] per layer (`grow`
    allocates them)."""
    shape = initial_cache[0]["self"]["key"].shape  # [B, H, 0, Dh]
    heads, head_dim = shape[1], shape[3]
    return heads, [tf.nest.map_structure(lambda t: tf.zeros([0, head_dim], t.dtype), c["self"])
                   for c in initial_cache]


def store_invariants(stores):
    """tf.while_loop shape invariants: rows grow, the head size stays."""
    return [{name: tf.TensorShape([None, t.shape[1]]) for name, t in store.items()}
            for store in stores]


def grow(stores, step, slots, heads, max_length):
    """The stores with room for time `step`: unchanged while it fits, else copied into one twice
    as large (at least INITIAL_CAPACITY steps, at most max_length)."""
    rows_per_step = slots * heads
    capacity = tf.shape(stores[0]["key"])[0] // rows_per_step

    def larger():
        wanted = tf.minimum(tf.maximum(2 * capacity, INITIAL_CAPACITY),
                            tf.maximum(max_length, step + 1))
        def extend(t):
            extra = tf.zeros([(wanted - capacity) * rows_per_step, tf.shape(t)[1]], t.dtype)
            return tf.concat([t, extra], axis=0)
        return tf.nest.map_structure(extend, stores)

    return tf.cond(step < capacity, lambda: stores, larger)


def step_rows(step, slots, heads, row_slots, ancestry):
    """Store rows of one step, for row_slots [R] (each hypothesis row's slot) and ancestry
    [R, step] (the slots of its history): "write_rows" [R * H] where this step's keys go, and
    "read_rows" [R, H, step + 1] the keys each row attends to, its own new ones last."""
    history = tf.concat([ancestry, row_slots[:, None]], axis=1)  # [R, step + 1]
    times = tf.range(tf.shape(history)[1])[None, :]  # [1, step + 1]
    head = tf.range(heads)
    read_rows = (times * slots + history)[:, None, :] * heads + head[None, :, None]
    write_rows = tf.reshape((step * slots + row_slots)[:, None] * heads + head[None, :], [-1])
    return {"write_rows": write_rows, "read_rows": read_rows}


def write_and_read(store, new, write_rows, read_rows):
    """store [rows, Dh], new [R, H, 1, Dh] -> (the store with `new` written in place,
    the keys/values [R, H, t + 1, Dh] at read_rows)."""
    store = tf.raw_ops.InplaceUpdate(x=store, i=write_rows,
                                     v=tf.reshape(new, [-1, tf.shape(new)[-1]]))
    return store, tf.gather(store, read_rows)
