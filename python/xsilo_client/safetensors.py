"""A small safetensors reader and writer on numpy, with torch tensors accepted when written.

The format: an 8-byte little-endian header length N, N bytes of JSON header, then the raw
little-endian data. The header maps each tensor name to
``{"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}`` (offsets relative to the
start of the data) and may hold ``"__metadata__"``: a str -> str map. The data is covered
exactly: no gaps, no overlaps, no trailing bytes.

The writer pads the header with spaces to a multiple of 8 and orders tensors by decreasing
item size, so that with an 8-aligned data start every tensor is aligned to its item size.
The reader maps the file and returns arrays that are views of the mapping (no copy), except
BF16 tensors, which numpy cannot represent and which are converted to float32 by default.
"""

import json
import mmap
import os
from collections.abc import Mapping

import numpy as np

__all__ = ["BF16", "DTYPES", "save_file", "load_file", "load_metadata", "is_torch_tensor"]

# safetensors dtype name -> numpy dtype of the stored bytes (BF16 is stored as its raw bits).
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# (numpy kind, item size) -> safetensors dtype name; byte order is fixed when writing.
_NUMPY_TO_NAME = {(dt.kind, dt.itemsize): name for name, dt in DTYPES.items() if name != "BF16"}

# A header larger than this is refused before it is parsed (real headers are kilobytes).
MAX_HEADER_BYTES = 100 << 20


class BF16:
    """Raw bfloat16 bits (a uint16 array) to be written with dtype BF16.

    ``load_file(path, bf16="raw")`` returns BF16 tensors as uint16 arrays; wrap one in
    ``BF16(bits)`` to write it back unchanged.
    """

    def __init__(self, bits):
        bits = np.asarray(bits)
        if bits.dtype.kind not in "ui" or bits.dtype.itemsize != 2:
            raise ValueError(f"BF16 wants 16-bit integer bits, got dtype {bits.dtype}")
        self.bits = bits.view(np.uint16)

    @property
    def shape(self):
        return self.bits.shape


def _torch_dtype_names():
    import torch
    return {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
            torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def is_torch_tensor(value):
    """True for a torch tensor; never imports torch for anything else."""
    if not type(value).__module__.startswith("torch"):
        return False
    import torch
    return isinstance(value, torch.Tensor)


def _describe(name, value):
    """(dtype name, shape, a function that returns the tensor as a numpy array).

    The array is produced only when the tensor is written, one tensor at a time.
    """
    if is_torch_tensor(value):
        import torch
        dtype_name = _torch_dtype_names().get(value.dtype)
        if dtype_name is None:
            raise ValueError(f"tensor {name!r}: dtype {value.dtype} cannot be written to safetensors")
        if dtype_name == "BF16":
            def get(t=value):
                return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        else:
            def get(t=value):
                return t.detach().cpu().contiguous().numpy()
        return dtype_name, tuple(value.shape), get
    if isinstance(value, BF16):
        return "BF16", value.bits.shape, lambda v=value: v.bits
    arr = np.asarray(value)
    if arr.dtype.name == "bfloat16" and arr.dtype.itemsize == 2:  # ml_dtypes' bfloat16
        return "BF16", arr.shape, lambda a=arr: a.view(np.uint16)
    dtype_name = _NUMPY_TO_NAME.get((arr.dtype.kind, arr.dtype.itemsize))
    if dtype_name is None:
        raise ValueError(f"tensor {name!r}: dtype {arr.dtype} cannot be written to safetensors")
    return dtype_name, arr.shape, lambda a=arr: a


def _little_endian_contiguous(arr, dtype_name):
    want = DTYPES[dtype_name]
    if arr.dtype != want:
        arr = arr.astype(want)
    return np.ascontiguousarray(arr)


def save_file(tensors, path, metadata=None, durable=True):
    """Write ``tensors`` (name -> numpy array, torch tensor or BF16) to ``path``.

    The file is written under a temporary name in the same folder, flushed to disk (unless
    ``durable`` is false: files exchanged with the agent need not survive a crash), and then
    renamed over ``path``, so a reader never sees half a file. Torch tensors are detached,
    moved to the CPU and made contiguous one at a time while writing (no second copy of a
    GPU model in host memory). ``metadata``, when given, must map str to str.
    """
    if not isinstance(tensors, Mapping):
        raise ValueError(f"tensors must be a mapping of name to array, got {type(tensors).__name__}")
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map str to str")
    entries = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"tensor name {name!r} is not allowed")
        dtype_name, shape, get = _describe(name, value)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        entries.append((name, dtype_name, [int(d) for d in shape], count * DTYPES[dtype_name].itemsize, get))
    # Larger items first, then by name: every tensor lands aligned to its item size.
    entries.sort(key=lambda e: (-DTYPES[e[1]].itemsize, e[0]))

    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype_name, shape, nbytes, _ in entries:
        header[name] = {"dtype": dtype_name, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)

    path = os.fspath(path)
    folder, base = os.path.split(path)
    tmp = os.path.join(folder, f".{base}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(len(header_bytes).to_bytes(8, "little"))
            f.write(header_bytes)
            for name, dtype_name, shape, nbytes, get in entries:
                arr = _little_endian_contiguous(get(), dtype_name)
                if arr.nbytes != nbytes:
                    raise ValueError(f"tensor {name!r}: {arr.nbytes} bytes, expected {nbytes}")
                if nbytes:
                    f.write(memoryview(arr.reshape(-1)).cast("B"))
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _reject_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _read_header(buf, size, path):
    """Parses and checks the header; returns (metadata, [(name, dtype, shape, begin, end)], data_start)."""
    if size < 8:
        raise ValueError(f"{path}: {size} bytes is shorter than the 8-byte header length")
    n = int.from_bytes(buf[:8], "little")
    if n > size - 8:
        raise ValueError(f"{path}: header length {n} does not fit the file of {size} bytes")
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"{path}: header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")

    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map str to str")

    data_size = size - 8 - n
    entries = []
    for name, info in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ValueError(f"{where}: entry is not an object")
        dtype_name = info.get("dtype")
        if dtype_name not in DTYPES:
            raise ValueError(f"{where}: unsupported dtype {dtype_name!r}")
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ValueError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        offsets = info.get("data_offsets")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) and o >= 0 for o in offsets)):
            raise ValueError(f"{where}: data_offsets {offsets!r} is not a pair of non-negative integers")
        begin, end = offsets
        if begin > end or end > data_size:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}] out of the data's {data_size} bytes")
        count = 1
        for d in shape:
            count *= d
        expected = count * DTYPES[dtype_name].itemsize
        if end - begin != expected:
            raise ValueError(f"{where}: data_offsets span {end - begin} bytes but "
                             f"{dtype_name} {shape} needs {expected}")
        entries.append((name, dtype_name, tuple(shape), begin, end))

    # The data is covered exactly once: sorted by offset, each tensor starts where the last ended.
    covered = 0
    previous = None
    for name, _, _, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != covered:
            what = "overlaps" if begin < covered else "leaves a gap after"
            raise ValueError(f"{path}: tensor {name!r} at [{begin}, {end}] {what} "
                             f"{'the start of the data' if previous is None else repr(previous)}")
        covered = end
        previous = name
    if covered != data_size:
        raise ValueError(f"{path}: {data_size - covered} bytes after the last tensor are not described "
                         "by the header")
    return metadata, entries, 8 + n


def _open_mapping(path, writable):
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None, 0
        access = mmap.ACCESS_COPY if writable else mmap.ACCESS_READ
        return mmap.mmap(f.fileno(), 0, access=access), size


def load_file(path, *, bf16="float32", writable=False):
    """Read a safetensors file: name -> numpy array, in the order of the header.

    Arrays are views of a memory mapping of the file (the mapping lives as long as they do).
    They are read-only unless ``writable=True``, which maps the file copy-on-write: writing to
    an array changes the process's copy, never the file. ``bf16="float32"`` (default) converts
    BF16 tensors to float32 arrays (exactly); ``bf16="raw"`` returns their bits as uint16.
    Raises ValueError naming the file and the tensor when the file is malformed.
    """
    if bf16 not in ("float32", "raw"):
        raise ValueError(f"bf16 must be 'float32' or 'raw', got {bf16!r}")
    path = os.fspath(path)
    buf, size = _open_mapping(path, writable)
    if buf is None:
        raise ValueError(f"{path}: the file is empty")
    try:
        _, entries, start = _read_header(buf, size, path)
    except ValueError:
        buf.close()
        raise
    out = {}
    for name, dtype_name, shape, begin, end in entries:
        dtype = DTYPES[dtype_name]
        count = (end - begin) // dtype.itemsize
        arr = np.frombuffer(buf, dtype=dtype, count=count, offset=start + begin).reshape(shape)
        if dtype_name == "BF16" and bf16 == "float32":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    if not entries:
        buf.close()
    return out


def load_metadata(path):
    """The ``__metadata__`` map of a safetensors file (empty when it has none), after checking the header."""
    path = os.fspath(path)
    buf, size = _open_mapping(path, False)
    if buf is None:
        raise ValueError(f"{path}: the file is empty")
    try:
        metadata, _, _ = _read_header(buf, size, path)
    finally:
        buf.close()
    return metadata
