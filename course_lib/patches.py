"""Image patches: the vision transformer's "tokenizer" (chapter 01).

A ViT (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words") cuts an image into
non-overlapping Ph x Pw patches and flattens each one into a vector; a linear layer then
maps each vector to a token embedding. This module does the cutting and its exact inverse,
nothing else (no projection, no class token, no position embeddings).

Shapes (channels last, like PIL and numpy images)::

    H, W   image height and width         Ph, Pw  patch height and width
    C      channels                       N = (H / Ph) * (W / Pw) patches
    B      batch (optional leading dim)

    image (H, W, C)  --patchify-->  patches (N, Ph*Pw*C)

    +----+----+----+
    | p0 | p1 | p2 |     patches are numbered row by row (row-major),
    +----+----+----+     each flattened in (Ph, Pw, C) order: pixel rows of the
    | p3 | p4 | p5 |     patch, then pixels within a row, then channels
    +----+----+----+

>>> import torch
>>> patchify(torch.zeros(224, 224, 3), 16).shape  # 14 * 14 patches of 16 * 16 * 3 values
torch.Size([196, 768])
>>> x = torch.arange(4 * 6).reshape(4, 6, 1)
>>> patchify(x, (2, 3))[1].tolist()   # top-right 2x3 patch: rows [3, 4, 5] and [9, 10, 11]
[3, 4, 5, 9, 10, 11]
>>> torch.equal(unpatchify(patchify(x, 2), (4, 6), 2), x)
True

The same thing in einops: ``rearrange(image, "(h ph) (w pw) c -> (h w) (ph pw c)", ph=Ph,
pw=Pw)``; the tests check both agree. Any dtype is accepted (bool masks included): this is a
pure rearrangement of values, so nothing numeric can go wrong.
"""

from __future__ import annotations

import torch

__all__ = ["patchify", "unpatchify"]


def _patch_hw(patch_size: int | tuple[int, int]) -> tuple[int, int]:
    """Normalise ``patch_size`` to ``(Ph, Pw)`` and check both are positive ints."""
    if isinstance(patch_size, int) and not isinstance(patch_size, bool):
        ph, pw = patch_size, patch_size
    elif (
        isinstance(patch_size, (tuple, list))
        and len(patch_size) == 2
        and all(isinstance(p, int) and not isinstance(p, bool) for p in patch_size)
    ):
        ph, pw = patch_size
    else:
        raise TypeError(f"patch_size must be an int or a pair of ints (Ph, Pw), got {patch_size!r}")
    if ph <= 0 or pw <= 0:
        raise ValueError(f"patch_size must be positive, got {patch_size!r}")
    return ph, pw


def patchify(image: torch.Tensor, patch_size: int | tuple[int, int]) -> torch.Tensor:
    """Cut an image (H, W, C) into flattened patches (N, Ph*Pw*C); see the module docstring.

    A batch (B, H, W, C) gives (B, N, Ph*Pw*C). ``patch_size`` is an int (square patches)
    or a pair (Ph, Pw). H must be divisible by Ph and W by Pw. Taught in chapter 01.

    >>> patchify(torch.zeros(2, 32, 48, 3), (16, 8)).shape   # 2 * 6 = 12 patches of 384
    torch.Size([2, 12, 384])
    """
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"image must be a torch.Tensor, got {type(image).__name__}")
    if image.dim() not in (3, 4):
        raise ValueError(
            "image must have shape (H, W, C) or (B, H, W, C), "
            f"got {image.dim()} dims: {tuple(image.shape)}"
        )
    ph, pw = _patch_hw(patch_size)
    batched = image.dim() == 4
    x = image if batched else image.unsqueeze(0)  # (H, W, C) -> (1, H, W, C)
    B, H, W, C = x.shape
    if H % ph:
        raise ValueError(f"image height H={H} is not divisible by patch height Ph={ph}")
    if W % pw:
        raise ValueError(f"image width W={W} is not divisible by patch width Pw={pw}")
    h, w = H // ph, W // pw
    x = x.reshape(B, h, ph, w, pw, C)  # (B, H, W, C) -> (B, h, Ph, w, Pw, C)
    x = x.permute(0, 1, 3, 2, 4, 5)  # -> (B, h, w, Ph, Pw, C)
    x = x.reshape(B, h * w, ph * pw * C)  # -> (B, N, Ph*Pw*C)  (copies: not contiguous)
    return x if batched else x.squeeze(0)  # (1, N, P) -> (N, P)


def unpatchify(
    patches: torch.Tensor,
    image_size: tuple[int, int],
    patch_size: int | tuple[int, int],
) -> torch.Tensor:
    """Exact inverse of :func:`patchify`: (N, Ph*Pw*C) -> (H, W, C), batched too.

    ``image_size`` is (H, W); C is inferred from the patch length. Chapter 01.

    >>> x = torch.rand(2, 8, 12, 3)
    >>> torch.equal(unpatchify(patchify(x, 4), (8, 12), 4), x)
    True
    """
    if not isinstance(patches, torch.Tensor):
        raise TypeError(f"patches must be a torch.Tensor, got {type(patches).__name__}")
    if patches.dim() not in (2, 3):
        raise ValueError(
            "patches must have shape (N, Ph*Pw*C) or (B, N, Ph*Pw*C), "
            f"got {patches.dim()} dims: {tuple(patches.shape)}"
        )
    ph, pw = _patch_hw(patch_size)
    if not (isinstance(image_size, (tuple, list)) and len(image_size) == 2):
        raise TypeError(f"image_size must be a pair (H, W), got {image_size!r}")
    H, W = image_size
    if H <= 0 or W <= 0:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    if H % ph:
        raise ValueError(f"image height H={H} is not divisible by patch height Ph={ph}")
    if W % pw:
        raise ValueError(f"image width W={W} is not divisible by patch width Pw={pw}")
    batched = patches.dim() == 3
    x = patches if batched else patches.unsqueeze(0)  # (N, P) -> (1, N, P)
    B, N, P = x.shape
    h, w = H // ph, W // pw
    if N != h * w:
        raise ValueError(
            f"got N={N} patches, but a {H}x{W} image cut into {ph}x{pw} patches has {h * w}"
        )
    if P % (ph * pw):
        raise ValueError(
            f"patch length {P} is not a multiple of Ph*Pw={ph * pw}, so it cannot be "
            f"(Ph, Pw, C) = ({ph}, {pw}, C)"
        )
    C = P // (ph * pw)
    x = x.reshape(B, h, w, ph, pw, C)  # (B, N, Ph*Pw*C) -> (B, h, w, Ph, Pw, C)
    x = x.permute(0, 1, 3, 2, 4, 5)  # -> (B, h, Ph, w, Pw, C)
    x = x.reshape(B, H, W, C)  # -> (B, H, W, C)
    return x if batched else x.squeeze(0)  # (1, H, W, C) -> (H, W, C)
