"""Decoder self-attention keys/values for incremental decoding.

Two per-layer caches share one method, `append(key, value) -> (keys, values, cache)`, which is
all the attention layer knows of them: `AppendCache`, the plain one (a concat per step), and
`StoreCache`, the searches' fast one, written in place. `DecoderCache` owns a search's caches.

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


class AppendCache:
    """A layer's self-attention keys and values [B, H, t, Dh], each step's appended by a concat.

    Args:
      key, value: [B, H, t, Dh].

    Example:
      cache = AppendCache.empty(batch, heads, head_dim, tf.float32)
      keys, values, cache = cache.append(new_keys, new_values)  # new [B, H, 1, Dh]
    """

    def __init__(self, key, value):
        self.key, self.value = key, value  # [B, H, t, Dh]

    @classmethod
    def empty(cls, batch, heads, head_dim, dtype):
        """A cache of no positions.

        Args:
          batch, heads, head_dim: B, H, Dh.
          dtype: the keys' dtype.

        Returns:
          An `AppendCache` of [B, H, 0, Dh] keys and values.
        """
        empty = tf.zeros([batch, heads, 0, head_dim], dtype)
        return cls(empty, empty)

    def append(self, key, value):
        """Appends new positions.

        Args:
          key, value: [B, H, T, Dh].

        Returns:
          (all keys, all values [B, H, t + T, Dh], the grown cache).
        """
        key = tf.concat([self.key, key], axis=2)
        value = tf.concat([self.value, value], axis=2)
        return key, value, AppendCache(key, value)


class StoreCache:
    """A layer's self-attention keys and values for one search step, in in-place stores (see the
    module docstring): `append` writes the step's keys at `write_rows` and reads each row's
    history at `read_rows` (`step_rows`). Safe only as a search uses it: a store is written by the
    one step that owns it, and read after that write (the module docstring says why).

    Args:
      key_store, value_store: [rows, Dh] stores.
      write_rows: [R * H] int32, where this step's keys go.
      read_rows: [R, H, t + 1] int32, the keys each row attends to.
    """

    def __init__(self, key_store, value_store, write_rows, read_rows):
        self.key_store, self.value_store = key_store, value_store  # [rows, Dh]
        self.write_rows, self.read_rows = write_rows, read_rows  # [R * H], [R, H, t + 1]

    def append(self, key, value):
        """Writes one step's keys and values and reads each row's history.

        Args:
          key, value: [R, H, 1, Dh].

        Returns:
          (keys, values [R, H, t + 1, Dh], the cache with the written stores).
        """
        key_store, key = write_and_read(self.key_store, key, self.write_rows, self.read_rows)
        value_store, value = write_and_read(self.value_store, value, self.write_rows,
                                            self.read_rows)
        return key, value, StoreCache(key_store, value_store, self.write_rows, self.read_rows)


def grow(stores, step, slots, heads, max_length):
    """The stores with room for time `step`: unchanged while it fits, else copied into one twice as
    large (at least INITIAL_CAPACITY steps, at most max_length).

    Args:
      stores: per layer {"key", "value"} [capacity * slots * H, Dh].
      step: the time step to hold.
      slots, heads: the stores' slots and heads.
      max_length: the longest output.

    Returns:
      The stores, grown where needed.
    """
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
    """The store rows of one step.

    Args:
      step: the time step.
      slots, heads: the stores' slots and heads.
      row_slots: [R] int32, each hypothesis row's slot.
      ancestry: [R, step] int32, the slots of each row's history.

    Returns:
      {"write_rows": [R * H] where this step's keys go, "read_rows": [R, H, step + 1] the keys
      each row attends to, its own new ones last}.
    """
    history = tf.concat([ancestry, row_slots[:, None]], axis=1)  # [R, step + 1]
    times = tf.range(step + 1)[None, :]  # [1, step + 1]
    head = tf.range(heads)
    read_rows = (times * slots + history)[:, None, :] * heads + head[None, :, None]
    write_rows = tf.reshape((step * slots + row_slots)[:, None] * heads + head[None, :], [-1])
    return {"write_rows": write_rows, "read_rows": read_rows}


def write_and_read(store, new, write_rows, read_rows):
    """Writes new keys (or values) in place and reads histories.

    Args:
      store: [rows, Dh].
      new: [R, H, 1, Dh].
      write_rows: [R * H] int32.
      read_rows: [R, H, t + 1] int32.

    Returns:
      (the store with `new` written, the keys/values [R, H, t + 1, Dh] at read_rows).
    """
    width = new.shape[-1] if new.shape[-1] is not None else tf.shape(new)[-1]
    store = tf.raw_ops.InplaceUpdate(x=store, i=write_rows, v=tf.reshape(new, [-1, width]))
    return store, tf.gather(store, read_rows)


class DecoderCache:
    """The decoder's keys and values during a search, owned in one place.

    Per decoder layer: the self-attention stores above (one slot per hypothesis row of the
    search's first batch), and the encoder keys/values of the sentences still searched, which
    their hypotheses query together. The tensors are a tf.while_loop variable, `state`; this
    object holds what stays fixed (slots, heads, largest capacity) and the operations:
    `for_step` (the per-layer caches `model.decode_step` reads and appends to), `update` (what
    it appended) and `reorder` (each new hypothesis takes the history of the one it extends;
    sentences that left drop out).

    state: {"stores": per layer {"key", "value"} [capacity * slots * H, Dh],
            "ancestry": [R, t] int32, the slot each row's prefix held at each earlier time,
            "memory": per layer {"key", "value"} [A, H, S, Dh],
            "source_padding": [A, S] bool, True at real source tokens}

    Args:
      model: a `Transformer` (its `initial_cache`).
      memory: [B, S, D] from `model.encode`.
      source_padding: [B, S] from `model.encode`.
      slots: hypothesis rows of the first step (B * beams).
      max_length: the longest output, which bounds the stores' capacity.
      groups: the hypothesis rows per sentence (its beams), which query their sentence's
        memory row together; a Python int.

    Example (one search step, inside the decoding loop):
      caches, state = cache.for_step(state, step, row_slots)
      logits, caches = model.decode_step(tokens, step, caches, state["source_padding"])
      state = cache.reorder(cache.update(state, caches), row_slots, parents, staying)
    """

    def __init__(self, model, memory, source_padding, slots, max_length, groups):
        initial = model.initial_cache(memory)
        _, self.heads, _, head_dim = initial[0]["self"].key.shape  # [B, H, 0, Dh]
        self.slots, self.max_length, self.groups = slots, max_length, int(groups)
        stores = [{name: tf.zeros([0, head_dim], c["self"].key.dtype) for name in ("key", "value")}
                  for c in initial]
        self.state = {"stores": stores, "ancestry": tf.zeros([slots, 0], tf.int32),
                      "memory": [c["memory"] for c in initial], "source_padding": source_padding}

    def for_step(self, state, step, row_slots):
        """The per-layer caches of one step.

        Args:
          state: the loop's cache state.
          step: the time step.
          row_slots: [R] int32, the slot of each hypothesis row.

        Returns:
          (per-layer caches {"self": StoreCache, "memory": {"key", "value", "groups"}} for
          `model.decode_step`, the state with stores grown to hold the step).
        """
        rows = step_rows(step, self.slots, self.heads, row_slots, state["ancestry"])
        stores = grow(state["stores"], step, self.slots, self.heads, self.max_length)
        caches = [{"self": StoreCache(store["key"], store["value"], rows["write_rows"],
                                      rows["read_rows"]),
                   "memory": dict(memory, groups=self.groups)}
                  for store, memory in zip(stores, state["memory"])]
        return caches, dict(state, stores=stores)

    @staticmethod
    def update(state, caches):
        """Takes back what a step wrote.

        Args:
          state: the state `for_step` returned.
          caches: the caches `model.decode_step` returned.

        Returns:
          The state with the written stores.
        """
        return dict(state, stores=[{"key": c["self"].key_store, "value": c["self"].value_store}
                                   for c in caches])

    @staticmethod
    def reorder(state, row_slots, parents, staying):
        """Follows the search's choices after a step. Keys are never moved: only the [R, t]
        ancestry is.

        Args:
          state: the state after `update`.
          row_slots: [R] int32, this step's rows' slots.
          parents: [R'] int32, the rows (of this step's R) that the next step's hypotheses
            extend.
          staying: [A'] int32, the sentences still searched (indices into this step's A).

        Returns:
          The state for the next step.
        """
        ancestry = tf.concat([state["ancestry"], row_slots[:, None]], axis=1)
        memory, padding = state["memory"], state["source_padding"]
        memory, padding = tf.cond(
            tf.size(staying) < tf.shape(padding)[0],
            lambda: tf.nest.map_structure(lambda t: tf.gather(t, staying), (memory, padding)),
            lambda: (memory, padding))
        return dict(state, ancestry=tf.gather(ancestry, parents), memory=memory,
                    source_padding=padding)
