"""Read the CIFAR-10 python batches without running code from them, or letting numpy parse their states.

A batch is a pickled dict of bytes keys, lists of ints, bytes and one numpy uint8 array. ``pickle.load`` runs
whatever globals a crafted file names, and even numpy's own ``ndarray.__setstate__``/``dtype.__setstate__``
trust the state they are given (flags, sizes). So :class:`BatchUnpickler` admits exactly the names those
files use and maps each to a stand-in that checks its arguments:

* ``numpy.core.multiarray._reconstruct`` / ``numpy._core.multiarray._reconstruct`` + ``numpy.ndarray``
  (the official Python 2 files, and numpy 2 at protocols 2-4): an :class:`_ArrayState` that builds the array
  with ``np.frombuffer`` from a checked ``(version, shape, dtype, fortran, bytes)`` state;
* ``numpy.core.numeric._frombuffer`` / ``numpy._core.numeric._frombuffer`` (protocol 5): the same checks;
* ``numpy.dtype``: plain integer dtypes only (``u1``... ``i8``) with a default state;
* ``_codecs.encode``: only ``(str, 'latin1')``, how protocols 0-2 written by Python 3 spell ``bytes``.

Before that, :func:`prescan` walks the opcodes with :mod:`pickletools` (which builds nothing): declared
lengths must fit in the file and memo indices must be small, so no declared size is ever allocated (the C
unpickler would otherwise grow its memo table to any index a file names).
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
from pathlib import Path

import numpy as np

from nystrom_lab.data.file_checks import DataFileError

_INT_CODES = frozenset(f"{k}{n}" for k in "ui" for n in (1, 2, 4, 8))
_DEFAULT_DTYPE_STATE = (None, None, None, -1, -1, 0)  # names, fields, elsize, alignment, flags (+ metadata)


class _NdarrayMarker:
    """What ``numpy.ndarray`` resolves to: only ever passed to ``_reconstruct``."""


class _Dtype:
    """``numpy.dtype(code, align, copy)`` for plain integer codes; BUILD may set only the byte order."""

    def __init__(self, code: object, align: object = False, copy: object = True) -> None:
        text = code.decode("latin1") if isinstance(code, bytes) else code
        if not isinstance(text, str) or text not in _INT_CODES:
            raise pickle.UnpicklingError(f"dtype {code!r} is not a plain integer dtype")
        self.code, self.order = text, "|" if text.endswith("1") else "<"

    def __setstate__(self, state: object) -> None:
        order = state[1] if isinstance(state, tuple) and len(state) in (8, 9) else None
        if isinstance(order, bytes):
            order = order.decode("latin1")
        if order not in ("|", "<", ">", "=") or tuple(state[2:8]) != _DEFAULT_DTYPE_STATE:
            raise pickle.UnpicklingError("dtype state is not that of a plain integer dtype")
        self.order = order

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(("" if self.order == "|" else self.order) + self.code)


def _array(raw: object, dtype: object, shape: object, fortran: bool) -> np.ndarray:
    """A fresh array from checked pieces; anything off raises ``UnpicklingError``."""
    if isinstance(raw, (bytearray, memoryview, pickle.PickleBuffer)):
        raw = bytes(raw)  # copy out: no view of the unpickler's buffers outlives it
    ok = (
        isinstance(raw, bytes)
        and isinstance(dtype, _Dtype)
        and isinstance(shape, tuple)
        and all(type(n) is int and n >= 0 for n in shape)
        and len(shape) <= 8
    )
    if not ok or math.prod(shape) * dtype.dtype.itemsize != len(raw):
        raise pickle.UnpicklingError("array state does not describe an integer array of its data's size")
    return np.frombuffer(raw, dtype=dtype.dtype).reshape(shape, order="F" if fortran else "C").copy()


class _ArrayState:
    """What ``_reconstruct(ndarray, (0,), b'b')`` returns; BUILD's state makes :attr:`array`."""

    array: np.ndarray | None = None

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple) and len(state) == 5 and state[0] == 1:
            state = state[1:]  # (version, shape, dtype, is_fortran, data)
        if not (isinstance(state, tuple) and len(state) == 4 and isinstance(state[2], bool)):
            raise pickle.UnpicklingError("ndarray state is not (shape, dtype, is_fortran, data)")
        shape, dtype, fortran, raw = state
        self.array = _array(raw, dtype, shape, fortran)


def _reconstruct(cls: object, shape: object, typecode: object) -> _ArrayState:
    if cls is not _NdarrayMarker or shape != (0,) or typecode not in ("b", b"b"):
        raise pickle.UnpicklingError("_reconstruct is admitted only as _reconstruct(ndarray, (0,), 'b')")
    return _ArrayState()


def _frombuffer(buf: object, dtype: object, shape: object, order: object) -> np.ndarray:
    if order not in ("C", "F"):
        raise pickle.UnpicklingError(f"array order must be 'C' or 'F', got {order!r}")
    return _array(buf, dtype, shape, order == "F")


def _latin1_encode(text: object, encoding: object = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode is admitted only as (str, 'latin1'), got {encoding!r}")
    return text.encode("latin1")


_ALLOWED: dict[tuple[str, str], object] = {
    ("numpy", "ndarray"): _NdarrayMarker,
    ("numpy", "dtype"): _Dtype,
    ("_codecs", "encode"): _latin1_encode,
}
for _package in ("numpy.core", "numpy._core"):  # the module names of numpy 1.x and 2.x
    _ALLOWED[(f"{_package}.multiarray", "_reconstruct")] = _reconstruct
    _ALLOWED[(f"{_package}.numeric", "_frombuffer")] = _frombuffer


def prescan(raw: bytes, path: Path) -> None:
    """Walk the opcodes (nothing is built): a truncated stream, a declared length past the end of the data
    or a memo index beyond the number of opcodes (a valid pickle never has one) is a DataFileError."""
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(io.BytesIO(raw))):
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET") and arg > count:
                raise DataFileError(
                    path, f"not a CIFAR-10 python pickle (memo index {arg} at opcode {count})"
                )
    except DataFileError:
        raise
    except Exception as exc:  # pickletools raises ValueError for malformed streams, and others for odd args
        raise DataFileError(path, f"not a CIFAR-10 python pickle ({exc})") from None


class BatchUnpickler(pickle.Unpickler):
    """A pickle.Unpickler that builds only dicts, lists, tuples, bytes, str, numbers and integer arrays."""

    def __init__(self, file: io.BufferedIOBase, *, path: Path) -> None:
        super().__init__(file, encoding="bytes")  # Python 2 ``str`` keys and values stay bytes
        self.path = path

    def find_class(self, module: str, name: str) -> object:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise DataFileError(
                self.path,
                f"refused to load: the pickle names {module}.{name}, which a CIFAR-10 batch never holds"
                " (only numpy arrays, dicts, lists, bytes, str and ints are admitted; nothing was run)",
            )
        return found

    def persistent_load(self, pid: object) -> object:
        raise DataFileError(self.path, "refused to load: the pickle holds a persistent id")


def load_batch(raw: bytes, path: Path) -> object:
    """Unpickle one batch's bytes; top-level dict values that are arrays come back as ``np.ndarray``."""
    prescan(raw, path)
    try:
        obj = BatchUnpickler(io.BytesIO(raw), path=path).load()
    except DataFileError:
        raise
    except Exception as exc:  # a corrupt pickle raises many types (EOFError, UnpicklingError, TypeError, ...)
        raise DataFileError(path, f"not a CIFAR-10 python pickle ({type(exc).__name__}: {exc})") from None
    if isinstance(obj, dict):
        obj = {k: v.array if isinstance(v, _ArrayState) else v for k, v in obj.items()}
    return obj
