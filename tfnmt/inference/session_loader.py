"""Running a SavedModel's signatures the way TensorFlow Serving does.

TF Serving loads a SavedModel with TensorFlow's C++ `LoadSavedModel` (a Session: it runs the
graph's restore op, then its init op) and answers requests with `Session::Run` on a signature's
tensors. `tf.saved_model.load` takes another route (it rebuilds Python objects and rebinds the
functions' captured variables), so an export can pass it and still fail every TF Serving
request. The `tensorflow` wheel exports the C++ route as the C API `TF_LoadSessionFromSavedModel`
and `TF_SessionRun` (libtensorflow_cc.so.2); this module calls them through ctypes.

    import tensorflow_text  # registers the SentencePiece ops, as TF Serving links them
    with SessionModel("runs/de-en/export/1") as served:
        out = served.run("serving_default", {"sentences": np.array([b"Das ist ein Haus."])})

Only `tensorflow` (and what the graph's ops need registered) is imported: nothing of tfnmt.
"""
import ctypes
import os

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import error_codes_pb2, meta_graph_pb2

TF_STRING = 7
TSTRING_BYTES = 24  # sizeof(TF_TString)


class _Output(ctypes.Structure):  # TF_Output
    _fields_ = [("oper", ctypes.c_void_p), ("index", ctypes.c_int)]


class _Buffer(ctypes.Structure):  # TF_Buffer
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t),
                ("data_deallocator", ctypes.c_void_p)]


_SIGNATURES = {  # name: (restype, argtypes)
    "TF_NewStatus": (ctypes.c_void_p, []),
    "TF_DeleteStatus": (None, [ctypes.c_void_p]),
    "TF_GetCode": (ctypes.c_int, [ctypes.c_void_p]),
    "TF_Message": (ctypes.c_char_p, [ctypes.c_void_p]),
    "TF_NewSessionOptions": (ctypes.c_void_p, []),
    "TF_DeleteSessionOptions": (None, [ctypes.c_void_p]),
    "TF_SetConfig": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
    "TF_NewGraph": (ctypes.c_void_p, []),
    "TF_DeleteGraph": (None, [ctypes.c_void_p]),
    "TF_NewBuffer": (ctypes.POINTER(_Buffer), []),
    "TF_DeleteBuffer": (None, [ctypes.POINTER(_Buffer)]),
    "TF_LoadSessionFromSavedModel": (
        ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
                          ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_void_p,
                          ctypes.POINTER(_Buffer), ctypes.c_void_p]),
    "TF_CloseSession": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "TF_DeleteSession": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "TF_GraphOperationByName": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "TF_SessionRun": (
        None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_Output),
               ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(_Output),
               ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
               ctypes.c_void_p, ctypes.c_void_p]),
    "TF_AllocateTensor": (ctypes.c_void_p, [ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                            ctypes.c_int, ctypes.c_size_t]),
    "TF_DeleteTensor": (None, [ctypes.c_void_p]),
    "TF_TensorType": (ctypes.c_int, [ctypes.c_void_p]),
    "TF_NumDims": (ctypes.c_int, [ctypes.c_void_p]),
    "TF_Dim": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int]),
    "TF_TensorData": (ctypes.c_void_p, [ctypes.c_void_p]),
    "TF_TensorByteSize": (ctypes.c_size_t, [ctypes.c_void_p]),
    "TF_StringInit": (None, [ctypes.c_void_p]),
    "TF_StringCopy": (None, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "TF_StringGetDataPointer": (ctypes.c_void_p, [ctypes.c_void_p]),
    "TF_StringGetSize": (ctypes.c_size_t, [ctypes.c_void_p]),
    "TF_StringDealloc": (None, [ctypes.c_void_p]),
}
_library = None


def c_api():
    """TensorFlow's C API from the wheel's libtensorflow_cc.so.2, argument types declared."""
    global _library
    if _library is None:
        path = os.path.join(os.path.dirname(tf.__file__), "libtensorflow_cc.so.2")
        library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(library, name)
            function.restype, function.argtypes = restype, argtypes
        _library = library
    return _library


class SessionLoaderError(RuntimeError):
    """LoadSavedModel or Session::Run failed: the message is TensorFlow's."""


def _check(api, status, what):
    code = api.TF_GetCode(status)
    if code:
        message = api.TF_Message(status).decode("utf-8", "replace")
        raise SessionLoaderError(f"{what} failed ({error_codes_pb2.Code.Name(code)}): {message}")


def _output(api, graph, tensor_name):
    """'op:index' -> TF_Output."""
    name, _, index = tensor_name.partition(":")
    operation = api.TF_GraphOperationByName(graph, name.encode())
    if not operation:
        raise SessionLoaderError(f"the graph has no operation {name!r}")
    return _Output(operation, int(index or 0))


def _to_c_tensor(api, array):
    """A numpy array (bytes/str objects, or numbers) -> a new TF_Tensor (caller deletes)."""
    array = np.asarray(array)
    dims = (ctypes.c_int64 * array.ndim)(*array.shape)
    if array.dtype.kind in "OSU":
        items = [item.encode("utf-8") if isinstance(item, str) else bytes(item)
                 for item in array.reshape(-1).tolist()]
        tensor = api.TF_AllocateTensor(TF_STRING, dims, array.ndim, TSTRING_BYTES * len(items))
        base = api.TF_TensorData(tensor)
        for i, item in enumerate(items):
            api.TF_StringInit(base + i * TSTRING_BYTES)
            api.TF_StringCopy(base + i * TSTRING_BYTES, item, len(item))
        return tensor
    dtype = tf.as_dtype(array.dtype)
    array = np.ascontiguousarray(array)
    tensor = api.TF_AllocateTensor(dtype.as_datatype_enum, dims, array.ndim, array.nbytes)
    ctypes.memmove(api.TF_TensorData(tensor), array.ctypes.data, array.nbytes)
    return tensor


def _free_strings(api, tensor):
    if api.TF_TensorType(tensor) == TF_STRING:
        base = api.TF_TensorData(tensor)
        for i in range(api.TF_TensorByteSize(tensor) // TSTRING_BYTES):
            api.TF_StringDealloc(base + i * TSTRING_BYTES)


def _from_c_tensor(api, tensor):
    """A TF_Tensor -> numpy (strings as an object array of bytes)."""
    shape = [api.TF_Dim(tensor, i) for i in range(api.TF_NumDims(tensor))]
    base = api.TF_TensorData(tensor)
    if api.TF_TensorType(tensor) == TF_STRING:
        count = int(np.prod(shape, dtype=np.int64))
        items = [ctypes.string_at(api.TF_StringGetDataPointer(base + i * TSTRING_BYTES),
                                  api.TF_StringGetSize(base + i * TSTRING_BYTES))
                 for i in range(count)]
        return np.array(items, dtype=object).reshape(shape)
    dtype = tf.as_dtype(api.TF_TensorType(tensor)).as_numpy_dtype
    data = ctypes.string_at(base, api.TF_TensorByteSize(tensor)) if base else b""
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


class SessionModel:
    """A SavedModel loaded by TensorFlow's C++ loader, as TF Serving loads it.

    Args:
      export_dir: a SavedModel directory (one version).
      tags: the MetaGraph's tags (TF Serving: "serve").
      intra_threads: threads that one op may use (TF Serving's
        --tensorflow_intra_op_parallelism; 0: TensorFlow's default, one per core).
      inter_threads: threads that run independent ops at the same time
        (--tensorflow_inter_op_parallelism; 0: one per core).

    `signatures` maps each signature name to its SignatureDef; `run(name, inputs)` feeds numpy
    arrays by input name and returns every output as numpy (strings as bytes objects).
    """

    def __init__(self, export_dir, tags=("serve",), intra_threads=0, inter_threads=0):
        self._api = api = c_api()
        self._session = None
        status = api.TF_NewStatus()
        options = api.TF_NewSessionOptions()
        self._graph = api.TF_NewGraph()
        meta_graph = api.TF_NewBuffer()
        try:
            if intra_threads or inter_threads:
                config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra_threads,
                                                  inter_op_parallelism_threads=inter_threads)
                serialized = config.SerializeToString()
                api.TF_SetConfig(options, serialized, len(serialized), status)
                _check(api, status, "TF_SetConfig")
            c_tags = (ctypes.c_char_p * len(tags))(*[t.encode() for t in tags])
            self._session = api.TF_LoadSessionFromSavedModel(
                options, None, os.fsencode(export_dir), c_tags, len(tags), self._graph,
                meta_graph, status)
            _check(api, status, f"LoadSavedModel({export_dir})")
            proto = meta_graph_pb2.MetaGraphDef()
            proto.ParseFromString(ctypes.string_at(meta_graph.contents.data,
                                                   meta_graph.contents.length))
            # "__saved_model_init_op" is the loader's, not a servable signature.
            self.signatures = {name: signature for name, signature in proto.signature_def.items()
                               if not name.startswith("__")}
        finally:
            api.TF_DeleteBuffer(meta_graph)
            api.TF_DeleteSessionOptions(options)
            api.TF_DeleteStatus(status)

    def run(self, signature_name, inputs):
        """Runs a signature by Session::Run.

        Args:
          signature_name: a key of `signatures`.
          inputs: {input name: numpy array}.

        Returns:
          {output name: numpy array} (strings as bytes objects).

        Raises:
          SessionLoaderError: TensorFlow's error status, with its code and message.
        """
        api = self._api
        if signature_name not in self.signatures:
            raise KeyError(f"no signature {signature_name!r}; the export has "
                           f"{sorted(self.signatures)}")
        signature = self.signatures[signature_name]
        if set(inputs) != set(signature.inputs):
            raise KeyError(f"{signature_name} takes inputs {sorted(signature.inputs)}, "
                           f"got {sorted(inputs)}")
        input_names, output_names = sorted(inputs), sorted(signature.outputs)
        feeds = (_Output * len(input_names))(
            *[_output(api, self._graph, signature.inputs[n].name) for n in input_names])
        fetches = (_Output * len(output_names))(
            *[_output(api, self._graph, signature.outputs[n].name) for n in output_names])
        values = (ctypes.c_void_p * len(input_names))(
            *[_to_c_tensor(api, inputs[n]) for n in input_names])
        results = (ctypes.c_void_p * len(output_names))()
        status = api.TF_NewStatus()
        try:
            api.TF_SessionRun(self._session, None, feeds, values, len(input_names), fetches,
                              results, len(output_names), None, 0, None, status)
            _check(api, status, f"Session::Run of {signature_name}")
            return {name: _from_c_tensor(api, results[i])
                    for i, name in enumerate(output_names)}
        finally:
            for tensor in values:
                _free_strings(api, tensor)
                api.TF_DeleteTensor(tensor)
            for tensor in results:
                if tensor:
                    api.TF_DeleteTensor(tensor)
            api.TF_DeleteStatus(status)

    def close(self):
        if self._session:
            status = self._api.TF_NewStatus()
            self._api.TF_CloseSession(self._session, status)
            self._api.TF_DeleteSession(self._session, status)
            self._api.TF_DeleteStatus(status)
            self._session = None
        if self._graph:
            self._api.TF_DeleteGraph(self._graph)
            self._graph = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
