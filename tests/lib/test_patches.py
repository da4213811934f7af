"""Tests for course_lib.patches against einops.rearrange (an independent reference)."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

from course_lib.patches import patchify, unpatchify

SHAPES = [  # (H, W, C, patch_size)
    (224, 224, 3, 16),
    (32, 48, 3, (16, 8)),
    (6, 4, 1, (3, 2)),
    (8, 8, 5, 8),  # one patch
    (5, 7, 2, 1),  # one pixel per patch
    (12, 20, 4, (2, 10)),
]


def reference(image, ph, pw):
    if image.dim() == 3:
        return rearrange(image, "(h ph) (w pw) c -> (h w) (ph pw c)", ph=ph, pw=pw)
    return rearrange(image, "b (h ph) (w pw) c -> b (h w) (ph pw c)", ph=ph, pw=pw)


@pytest.mark.parametrize("H, W, C, patch_size", SHAPES)
def test_matches_einops_and_inverts(H, W, C, patch_size):
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    g = torch.Generator().manual_seed(H * W + C)
    image = torch.randn(H, W, C, generator=g)
    patches = patchify(image, patch_size)
    assert patches.shape == ((H // ph) * (W // pw), ph * pw * C)
    assert torch.equal(patches, reference(image, ph, pw))
    assert torch.equal(unpatchify(patches, (H, W), patch_size), image)
    batch = torch.randn(3, H, W, C, generator=g)
    bp = patchify(batch, patch_size)
    assert torch.equal(bp, reference(batch, ph, pw))
    assert torch.equal(bp[1], patchify(batch[1], patch_size))
    assert torch.equal(unpatchify(bp, (H, W), patch_size), batch)


def test_docstring_example_and_order():
    assert patchify(torch.zeros(224, 224, 3), 16).shape == (196, 768)
    x = torch.arange(4 * 6).reshape(4, 6, 1)
    p = patchify(x, (2, 3))
    # row-major patches: top-left, top-right, bottom-left, bottom-right
    assert p.tolist() == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11],
                          [12, 13, 14, 18, 19, 20], [15, 16, 17, 21, 22, 23]]  # fmt: skip
    # channels are innermost within a pixel
    rgb = torch.arange(2 * 2 * 3).reshape(2, 2, 3)
    assert patchify(rgb, 2).tolist() == [list(range(12))]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float16, torch.bool])
def test_any_dtype(dtype):
    x = (torch.arange(4 * 4 * 2).reshape(4, 4, 2) % 3).to(dtype)
    p = patchify(x, 2)
    assert p.dtype == dtype and torch.equal(p, reference(x, 2, 2))
    assert torch.equal(unpatchify(p, (4, 4), 2), x)


def test_non_contiguous_input():
    x = torch.randn(3, 8, 6).permute(1, 2, 0)  # (8, 6, 3), not contiguous
    assert torch.equal(patchify(x, 2), reference(x, 2, 2))


def test_errors():
    img = torch.zeros(10, 12, 3)
    with pytest.raises(ValueError, match="H=10.*Ph=4"):
        patchify(img, 4)
    with pytest.raises(ValueError, match="W=12.*Pw=5"):
        patchify(img, (5, 5))
    with pytest.raises(ValueError, match="got 2 dims"):
        patchify(torch.zeros(4, 4), 2)
    with pytest.raises(ValueError, match="got 5 dims"):
        patchify(torch.zeros(1, 1, 4, 4, 1), 2)
    with pytest.raises(ValueError, match="positive"):
        patchify(img, 0)
    with pytest.raises(ValueError, match="positive"):
        patchify(img, (2, -1))
    with pytest.raises(TypeError, match="patch_size"):
        patchify(img, 2.0)
    with pytest.raises(TypeError, match="Tensor"):
        patchify([[1]], 1)
    p = patchify(torch.zeros(8, 8, 3), 4)
    with pytest.raises(ValueError, match="N=4"):
        unpatchify(p, (8, 12), 4)
    with pytest.raises(ValueError, match="H=9"):
        unpatchify(p, (9, 8), 4)
    with pytest.raises(ValueError, match="not a multiple"):
        unpatchify(p[:, :47], (8, 8), 4)


def test_docstring_examples():
    import doctest

    from course_lib import patches

    assert doctest.testmod(patches).failed == 0
