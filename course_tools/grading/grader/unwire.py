"""Values back from plain data: the grader's reading of what a graded run sent (:mod:`.wire`'s format).

**Grader side**: runs in the grader's own process, never beside student code.

A record comes from the sandbox, so it may be forged: :func:`decode` checks every field (tags,
dtypes, byte counts, depth) and raises :class:`WireError` on anything malformed, so a
forged record fails its exercise instead of reaching a comparison. It rebuilds only plain types,
never a subclass, and runs no code.

    >>> from course_tools.grading.sandboxed.wire import encode
    >>> decode(encode({"loss": 1.5, "ids": [1, 2]}))
    {'loss': 1.5, 'ids': [1, 2]}
"""

from __future__ import annotations

import base64
import math

import numpy as np
import torch

from course_tools.grading.sandboxed.wire import MAX_DEPTH, NUMPY_DTYPES, TENSOR_DTYPES, Unencodable


class WireError(ValueError):
    """A record that is not well-formed plain data."""


def decode(data, _depth: int = 0):
    """The value :func:`encode` made; :class:`WireError` on anything that is not its output."""
    if _depth > MAX_DEPTH + 1:
        raise WireError("structure nested too deeply")
    kind = type(data)
    if data is None or kind in (bool, str, float):
        return data
    if kind is int:
        if abs(data) >= 2**53:
            raise WireError("large integer not sent as text")
        return data
    if kind is list:
        return [decode(v, _depth + 1) for v in data]
    if kind is not dict or len(data) == 0:
        raise WireError(f"unexpected {kind.__name__}")
    tag = next(iter(data))
    try:
        return _DECODERS[tag](data, _depth)
    except KeyError:
        raise WireError(f"unknown tag {str(tag)[:40]!r}") from None
    except (TypeError, ValueError, OverflowError, RuntimeError) as e:
        if isinstance(e, WireError):
            raise
        raise WireError(f"malformed {tag}: {str(e)[:120]}") from None


def _fields(data: dict, *names: str) -> list:
    if set(data) != set(names):
        raise WireError(f"expected fields {sorted(names)}, got {sorted(map(str, data))[:10]}")
    return [data[n] for n in names]


def _bytes(text) -> bytes:
    if type(text) is not str:
        raise WireError("data is not text")
    return base64.b64decode(text.encode("ascii"), validate=True)


def _shape(shape) -> tuple[int, ...]:
    if type(shape) is not list or len(shape) > 16 or any(type(n) is not int or n < 0 for n in shape):
        raise WireError(f"bad shape {str(shape)[:60]}")
    return tuple(shape)


def _tensor(data: dict, _depth: int) -> torch.Tensor:
    dtype, shape, grad, text = _fields(data, "tensor", "shape", "grad", "data")
    if dtype not in TENSOR_DTYPES or type(grad) is not bool:
        raise WireError(f"bad tensor dtype {str(dtype)[:40]}")
    raw, shape = _bytes(text), _shape(shape)
    dt = TENSOR_DTYPES[dtype]
    if len(raw) != math.prod(shape) * torch.empty((), dtype=dt).element_size():
        raise WireError("tensor data does not match its shape")
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    t = flat.view(dt).reshape(shape).clone()
    return t.requires_grad_(grad) if grad and t.is_floating_point() else t


def _array(data: dict, _depth: int):
    dtype, shape, scalar, text = _fields(data, "ndarray", "shape", "scalar", "data")
    if dtype not in NUMPY_DTYPES or type(scalar) is not bool:
        raise WireError(f"bad array dtype {str(dtype)[:40]}")
    raw, shape = _bytes(text), _shape(shape)
    if len(raw) != math.prod(shape) * np.dtype(dtype).itemsize:
        raise WireError("array data does not match its shape")
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if scalar:
        if shape != ():
            raise WireError("a scalar with a shape")
        return arr[()]
    return arr


def _special_float(data: dict, _depth: int) -> float:
    (text,) = _fields(data, "float")
    if text not in ("nan", "inf", "-inf"):
        raise WireError(f"bad float {str(text)[:20]}")
    return float(text)


def _big_int(data: dict, _depth: int) -> int:
    (text,) = _fields(data, "int")
    if type(text) is not str or len(text) > 4000 or not text.lstrip("-").isdigit():
        raise WireError("bad integer")
    return int(text)


def _items(data: dict, tag: str) -> list:
    (items,) = _fields(data, tag)
    if type(items) is not list:
        raise WireError(f"{tag} is not a list")
    return items


def _dict(data: dict, depth: int) -> dict:
    out = {}
    for pair in _items(data, "dict"):
        if type(pair) is not list or len(pair) != 2:
            raise WireError("bad dict entry")
        key = decode(pair[0], depth + 1)
        try:
            out[key] = decode(pair[1], depth + 1)
        except TypeError:
            raise WireError("unhashable dict key") from None
    return out


def _unencodable(data: dict, _depth: int) -> Unencodable:
    (name,) = _fields(data, "unencodable")
    if type(name) is not str:
        raise WireError("bad type name")
    return Unencodable(name[:80])


_DECODERS = {
    "tensor": _tensor, "ndarray": _array, "float": _special_float, "int": _big_int,
    "tuple": lambda d, depth: tuple(decode(v, depth + 1) for v in _items(d, "tuple")),
    "dict": _dict, "size": lambda d, depth: torch.Size(_shape(_items(d, "size"))),
    "dtype": lambda d, depth: _dtype(_fields(d, "dtype")[0]), "unencodable": _unencodable,
}


def _dtype(name) -> torch.dtype:
    if name not in TENSOR_DTYPES:
        raise WireError(f"bad dtype {str(name)[:40]}")
    return TENSOR_DTYPES[name]
