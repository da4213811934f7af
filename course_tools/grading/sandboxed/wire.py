"""Values as plain data: what a graded run may send to the grader, in a form that cannot carry code.

**Sandboxed side**: runs inside the sandbox, beside student code; it decides no verdict.

A graded answer's outputs leave the sandbox as JSON built by :func:`encode` and are rebuilt in
the grader, where no student code runs, by :mod:`course_tools.grading.grader.unwire`. Only these
come back, as the plain types named here and never as a subclass: ``None``, ``bool``, ``int``,
``float``, ``str``, ``list``, ``tuple``, ``dict``, ``torch.Tensor`` (dense, on the CPU),
``torch.Size``, ``torch.dtype``, ``numpy.ndarray`` and NumPy scalars. Anything else is sent as
``Unencodable(<type name>)``, which fails any comparison with a message naming the type.

    >>> encode({"loss": 1.5, "ids": [1, 2]})
    {'dict': [['loss', 1.5], ['ids', [1, 2]]]}
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
