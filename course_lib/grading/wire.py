"""Values as plain data: what a graded run may send to the grader, in a form that cannot carry code.

A graded answer's outputs leave the sandbox as JSON built by :func:`encode` and are rebuilt by
:func:`decode` in the grader, where no student code runs. Only these come back, as the plain types
named here and never as a subclass: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``,
``tuple``, ``dict``, ``torch.Tensor`` (dense, on the CPU), ``torch.Size``, ``torch.dtype``,
``numpy.ndarray`` and NumPy scalars. Anything else is sent as ``Unencodable(<type name>)``, which
fails any comparison with a message naming the type. :func:`decode` checks every field (tags,
dtypes, byte counts, depth, total size) and raises :class:`WireError` on anything malformed, so a
forged record fails its exercise instead of reaching a comparison.

    >>> decode(encode({"loss": 1.5, "ids": [1, 2]}))
    {'loss': 1.5, 'ids': [1, 2]}
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass

import numpy as np
import torch

MAX_BYTES = 64 * 2**20  # all tensor data of one record together
MAX_DEPTH = 32
TENSOR_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
NUMPY_DTYPES = {"float64", "float32", "float16", "complex64", "complex128", "int64", "int32", "int16",
                "int8", "uint64", "uint32", "uint16", "uint8", "bool"}


class WireError(ValueError):
    """A record that is not well-formed plain data."""


@dataclass(frozen=True)
class Unencodable:
    """Stands for a value that cannot travel as data (a module, a function, a generator...)."""

    type_name: str

    def __repr__(self) -> str:
        return f"<a {self.type_name}, which the grader cannot compare>"


def _float(x: float):
    return x if math.isfinite(x) else {"float": repr(x)}  # JSON has no nan or inf


def encode(value, _depth: int = 0, _budget: list | None = None):
    """``value`` as JSON-able plain data (see the module docstring)."""
    budget = [MAX_BYTES] if _budget is None else _budget
    if _depth > MAX_DEPTH:
        return {"unencodable": "structure nested too deeply"}
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value if abs(value) < 2**53 else {"int": str(value)}
    if kind is float:
        return _float(value)
    if kind is torch.Size:
        return {"size": [int(n) for n in value]}
    if isinstance(value, (list, tuple)):  # a subclass (a named tuple) travels as its base type
        items = [encode(v, _depth + 1, budget) for v in value]
        return items if isinstance(value, list) else {"tuple": items}
    if isinstance(value, dict):  # Counter, defaultdict...: a dict
        return {"dict": [[encode(k, _depth + 1, budget), encode(v, _depth + 1, budget)]
                         for k, v in value.items()]}
    if kind is torch.dtype:
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Tensor):
        return _encode_tensor(value, budget)
    if isinstance(value, (np.ndarray, np.generic)):
        return _encode_array(value, budget)
    return {"unencodable": kind.__name__[:80]}


def _take(budget: list, n: int) -> bool:
    budget[0] -= n
    return budget[0] >= 0


def _encode_tensor(t: torch.Tensor, budget: list):
    # The base class's own methods: a subclass's overrides are not asked how to describe itself.
    t = torch.Tensor.as_subclass(t, torch.Tensor)
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in TENSOR_DTYPES or t.layout != torch.strided or t.is_quantized or t.is_meta:
        return {"unencodable": f"tensor of {t.dtype}, {t.layout}"}
    if not _take(budget, t.numel() * t.element_size()):
        return {"unencodable": "tensor too large to send"}
    data = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().cpu().reshape(-1))  # dense, stride 1
    raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return {"tensor": dtype, "shape": list(t.shape), "grad": bool(t.requires_grad),
            "data": base64.b64encode(raw).decode("ascii")}


def _encode_array(a, budget: list):
    scalar = isinstance(a, np.generic)
    arr = np.asarray(a)
    if arr.dtype.name not in NUMPY_DTYPES:
        return {"unencodable": f"array of {arr.dtype.name}"}
    if not _take(budget, arr.nbytes):
        return {"unencodable": "array too large to send"}
    return {"ndarray": arr.dtype.name, "shape": list(arr.shape), "scalar": scalar,
            "data": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")}


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
