"""Layers by rate of change and the matrix's compile-cache keys: grouping, validation, rendering."""

from __future__ import annotations

import re

import pytest
import yaml

from builder.config import contract, matrix
from builder.deps.buildcontext import layer_of
from builder.dockerfile import render
from builder.errors import ConfigError
from tests.conftest import REPO

BASE = yaml.safe_load((REPO / "matrix.yaml").read_text())


def _load(tmp_path, change) -> matrix.Matrix:
    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    change(doc["targets"]["cu129"])
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(doc))
    return matrix.load(path)


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("nvidia-cublas-cu12", "cuda"),
        ("nvidia_nccl_cu12", "cuda"),
        ("cuda-bindings", "cuda"),
        ("torch", "torch"),
        ("Triton", "torch"),
        ("torchaudio", "torch"),
        ("torchao", "deps"),
        ("flashinfer-python", "flashinfer"),
        ("flashinfer_jit_cache", "flashinfer"),
        ("numpy", "deps"),
    ],
)
def test_default_grouping_by_normalized_name(name, layer):
    target = matrix.load(REPO / "matrix.yaml").target("cu129")
    assert layer_of(target, name) == layer


def test_layer_order_is_the_matrix_order_then_deps():
    target = matrix.load(REPO / "matrix.yaml").target("cu129")
    assert contract.layer_names(target.layers) == ["cuda", "torch", "flashinfer", "deps"]


def test_first_matching_group_wins(tmp_path):
    target = _load(
        tmp_path,
        lambda t: t.update(
            layers=[{"name": "big", "match": ["torch*", "nvidia-*"]}, {"name": "cuda", "match": ["nvidia-*"]}]
        ),
    ).target("cu129")
    assert layer_of(target, "nvidia-cudnn-cu12") == "big"


@pytest.mark.parametrize(
    "layers",
    [
        [{"name": "app", "match": ["x"]}],
        [{"name": "deps", "match": ["x"]}],
        [{"name": "a", "match": ["x"]}, {"name": "a", "match": ["y"]}],
    ],
)
def test_reserved_or_repeated_layer_names_are_refused(tmp_path, layers):
    with pytest.raises(ConfigError, match=r"matrix\.yaml.*layers\.\d\.name"):
        _load(tmp_path, lambda t: t.update(layers=layers))


@pytest.mark.parametrize(
    "layers",
    [
        [{"name": "Bad Name", "match": ["x"]}],
        [{"name": "a", "match": []}],
        [{"name": "a", "match": ["x;rm"]}],
        [{"name": "a", "match": ["../x"]}],
        [{"name": "a"}],
    ],
)
def test_malformed_layers_are_config_errors(tmp_path, layers):
    with pytest.raises(ConfigError, match=r"layers"):
        _load(tmp_path, lambda t: t.update(layers=layers))


def test_each_group_becomes_its_own_copy_into_the_final_stage():
    text = (REPO / "dockerfiles" / "cu129" / "Dockerfile").read_text()
    final = text[text.rindex("\nFROM ") :]
    copies = re.findall(r"^COPY --from=compiled /layers/([a-z0-9-]+)/opt /opt$", final, re.M)
    assert copies == ["base", "cuda", "torch", "flashinfer", "deps", "app-native", "app-python"]


def _compile_stages(text: str) -> dict[str, str]:
    """Stage name -> its compile RUN's flags line, for the compile-* stages."""
    found = re.findall(r"^FROM build AS (compile-[a-z-]+)\n(?:#.*\n)*(RUN [^\n]*)", text, re.M)
    return dict(found)


@pytest.mark.parametrize(
    "url",
    [
        "s3://k3-cache/vllm?region=eu-west-1",
        "redis://cache.internal:6379/2",
        "gha://",
        "gcs://bucket/prefix",
        "webdavs://dav.example.org/k3",
    ],
)
def test_matrix_cache_url_opts_into_the_remote_cache(tmp_path, url):
    def change(t):
        t["compile"]["remote_cache"] = False
        t["compile"]["cache_url"] = url

    target = _load(tmp_path, change).target("cu129")
    assert target.compile.remote
    stages = _compile_stages(render.render(target))
    assert stages == {"compile-offline": "RUN --network=none \\", "compile-remote-cache": "RUN \\"}


@pytest.mark.parametrize(
    "url", ["redis://user:pw@cache:6379", "http://cache:80", "s3://b/p?x=$(id)", "redis://cache:6379/\n", "s3://b/p x"]
)
def test_matrix_cache_url_without_credentials_or_shell(tmp_path, url):
    with pytest.raises(ConfigError, match=r"compile\.cache_url"):
        _load(tmp_path, lambda t: t["compile"].update(cache_url=url))


def test_without_remote_cache_the_compile_has_no_network(tmp_path):
    target = _load(tmp_path, lambda t: t["compile"].update(remote_cache=False)).target("cu129")
    text = render.render(target)
    assert _compile_stages(text) == {"compile-offline": "RUN --network=none \\"}
    assert "HAS NETWORK ACCESS" not in text and contract.COMPILE_MODE_ARG not in text
    assert "\nFROM compile-offline AS compiled\n" in text


def test_a_remote_cache_target_still_compiles_offline_by_default():
    """The committed cu129 Dockerfile allows a remote cache, yet with no build argument (no backend
    given) the stage that builds is the network-off one."""
    text = (REPO / "dockerfiles" / "cu129" / "Dockerfile").read_text()
    assert f"ARG {contract.COMPILE_MODE_ARG}=offline\n" in text
    assert f"FROM compile-${{{contract.COMPILE_MODE_ARG}}} AS compiled" in text
    assert _compile_stages(text) == {
        "compile-offline": "RUN --network=none \\",
        f"compile-{contract.COMPILE_MODE_REMOTE}": "RUN \\",
    }
    remote = text[text.index(f"FROM build AS compile-{contract.COMPILE_MODE_REMOTE}") : text.index("AS compiled")]
    assert "HAS NETWORK ACCESS" in text and "--mount=type=secret,id=k3_compile_cache,required=true" in remote
