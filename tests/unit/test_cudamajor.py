"""Which CUDA major a distribution belongs to (builder/config/cudamajor.py): the one rule the image check
no_other_cuda_major and the lock rehearsal share."""

from __future__ import annotations

import pytest

from builder.config.cudamajor import cuda_major_of, is_other_major, major_minor


@pytest.mark.parametrize("version,cut", [("12.9.1", "12.9"), ("13.0", "13.0"), ("12", "12"), (None, None), ("", None)])
def test_major_minor(version, cut):
    assert major_minor(version) == cut


@pytest.mark.parametrize(
    "name,version,major",
    [
        # a -cuNN suffix names the major, wherever the version points
        ("nvidia-nccl-cu12", "2.30.7", 12),
        ("nvidia_nccl_cu13", "2.28.9", 13),
        ("nvidia-cutlass-dsl-libs-cu13", "4.7.1", 13),
        ("cupy-cuda12x", "13.0.0", None),  # not a -cuNN suffix
        ("nvidia-cu12-thing", "1.0", 12),  # a suffix in the middle counts too
        # a +cuNNN local version: the last digit is the minor
        ("torch", "2.13.0+cu129", 12),
        ("torch", "2.13.0+cu130", 13),
        ("flashinfer-jit-cache", "0.6.18.post1+cu130", 13),
        ("torch", "2.13.0+cu92", 92),  # two digits: all major (CUDA 9.2 wrote cu92: an old, odd tag)
        ("torch", "2.13.0+cpu", None),
        ("torch", "2.13.0+cu129.post1", None),
        (
            "torch",
            "2.14.1",
            None,
        ),  # PyPI's bare torch: not told by name or version (the image check reads torch.version.cuda)
        # unsuffixed wheels whose version is the CUDA version
        ("cuda-toolkit", "13.0.3", 13),
        ("nvidia-cuda-runtime", "13.0.96", 13),
        ("nvidia-cuda-nvdisasm", "13.5.37", 13),
        ("nvidia-cublas", "13.1.0.3", 13),
        ("nvidia-nvjitlink", "12.9.86", 12),
        ("nvidia-nvtx", "13.0.85", 13),
        ("cuda-bindings", "12.9.10", 12),
        ("cuda-python", "13.0.1", 13),
        # unsuffixed wheels with a library version: the name alone says CUDA 13
        ("nvidia-curand", "10.4.0.35", 13),
        ("nvidia-cufft", "12.0.0.61", 13),
        ("nvidia-cusolver", "12.0.4.66", 13),
        ("nvidia-cusparse", "12.6.3.3", 13),
        ("nvidia-cufile", "1.15.1.6", 13),
        ("nvidia-npp", "13.0.1.2", 13),
        ("nvidia-nvjpeg", "13.0.1.86", 13),
        # placeholders and the rest
        ("nvidia-cuda-runtime", "0.0.1.dev5", None),
        ("nvidia-curand", "0.0.1", None),
        ("cuda-toolkit", "dev", None),
        ("nvidia-cuda-runtime", "x13.0", None),
        ("numpy", "2.2.0", None),
        ("nvidia-cudnn-frontend", "1.14.0", None),  # a name no rule covers
        ("nvidia-cublas-extra", "13.0", None),  # the whole name must match, not a prefix
    ],
)
def test_cuda_major_of(name, version, major):
    assert cuda_major_of(name, version) == major


def test_is_other_major():
    assert is_other_major("nvidia-nccl-cu13", "2.28.9", 12)
    assert not is_other_major("nvidia-nccl-cu12", "2.30.7", 12)
    assert not is_other_major("numpy", "2.2.0", 12)  # unknown is never "other"
    assert is_other_major("torch", "2.13.0+cu129", 13)
