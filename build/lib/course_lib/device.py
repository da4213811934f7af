"""Choosing a device and a precision: the one helper notebooks and scripts use.

Library code never picks a device: it follows its inputs (``x.device``, ``x.dtype``). Only
notebooks and scripts call :func:`get_device` and :func:`autocast`.

- ``get_device("auto")``: CUDA if available, else CPU. Apple's MPS only when asked for
  (``"mps"``, or ``COURSE_DEVICE=mps``), because some torch versions give wrong losses on it.
- ``precision``: ``"auto"`` is bf16 autocast on a CUDA device that supports it and fp32
  elsewhere; ``"bf16"`` on a CPU is opt-in (fast on CPUs with AMX). Tests pin ``"fp32"``.

>>> get_device("cpu")
device(type='cpu')
>>> resolve_precision("auto", torch.device("cpu"))
'fp32'
"""

from __future__ import annotations

import contextlib
import os

import torch

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "fp32", "bf16")


def get_device(name: str | None = None) -> torch.device:
    """The device to run on: ``name`` or, if None, ``$COURSE_DEVICE`` or ``"auto"``."""
    name = (name or os.environ.get("COURSE_DEVICE") or "auto").lower()
    if name.split(":")[0] not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES} (optionally 'cuda:N'), got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} was asked for, but torch sees no CUDA GPU")
    if name == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError("device 'mps' was asked for, but this torch build has no MPS support")
    return torch.device(name)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"`` for ``precision`` on ``device`` (resolving ``"auto"``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return "bf16" if cuda_bf16 else "fp32"
    return precision


def autocast(device: torch.device, precision: str = "auto"):
    """A context manager running matmuls in bf16 when the precision says so, else a no-op."""
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
