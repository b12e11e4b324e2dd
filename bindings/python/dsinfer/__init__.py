"""dsinfer — Python binding of libdsinfer (DeepSeek V4 / V4.1 Flash inference), over ctypes.

    import dsinfer
    with dsinfer.Context(n_threads=2) as ctx, ctx.load_model("model.gguf") as model, \\
            model.session() as s, dsinfer.Sampler(temperature=0) as smp:
        prompt = model.tokenize("The capital of France is", add_bos=True)
        for piece in s.stream(smp, prompt, max_tokens=32):
            print(piece.text, end="", flush=True)

The shared library is found through $DSINFER_LIBRARY, the source checkout's build tree,
pkg-config, then the dynamic loader (see docs/bindings.md); ``dsinfer.library_path`` says
which file was loaded.
"""

from . import _ffi
from ._core import (  # noqa: F401
    AbiMismatchError, BackendError, BadFormatError, BusyError, CancelledError, Context,
    ContextFullError, Detokenizer, DeviceInfo, Error, GenerationResult, InternalError,
    InvalidArgumentError, IoError, Model, ModelInfo, NotFoundError, OutOfDeviceMemoryError,
    OutOfHostMemoryError, Piece, Sampler, Session, StateMismatchError, Stream,
    UnsupportedError, abi_version, library_path, open_handles, status_string, type_name,
    version)
from ._ffi import ABI_VERSION, LibraryNotFound  # noqa: F401

__version__ = "0.1.0"
