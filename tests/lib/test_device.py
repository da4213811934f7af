import pytest
import torch

from course_lib import device


def test_auto_picks_cuda_only_when_available(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.get_device().type == expected
    assert device.get_device("auto").type == expected


def test_environment_variable_and_explicit_cpu(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert device.get_device() == torch.device("cpu")
    assert device.get_device("CPU") == torch.device("cpu")


def test_bad_names_and_missing_hardware_fail_clearly():
    with pytest.raises(ValueError, match="device must be one of"):
        device.get_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            device.get_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(RuntimeError, match="MPS"):
            device.get_device("mps")


def test_precision_auto_is_fp32_on_cpu_and_bf16_is_opt_in():
    cpu = torch.device("cpu")
    assert device.resolve_precision("auto", cpu) == "fp32"
    assert device.resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="precision must be one of"):
        device.resolve_precision("fp16", cpu)


def test_autocast_bf16_on_cpu_changes_matmul_dtype_and_fp32_does_not():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with device.autocast(torch.device("cpu"), "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with device.autocast(torch.device("cpu"), "fp32"):
        assert (a @ b).dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_auto_precision_on_cuda_follows_bf16_support():
    cuda = torch.device("cuda")
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    assert device.resolve_precision("auto", cuda) == expected
