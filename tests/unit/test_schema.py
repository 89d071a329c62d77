"""`build schema`: matrix.yaml's JSON Schema from the models, committed as docs/matrix.schema.json,
named on matrix.yaml's first line, and kept current (like `build render --check`)."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest
import yaml

from builder.cli import main
from builder.config import matrix
from builder.config import matrixschema as schema
from tests.conftest import REPO

COMMITTED = REPO / "docs" / "matrix.schema.json"


def _validator() -> jsonschema.Draft202012Validator:
    doc = json.loads(COMMITTED.read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def _raw(text: str) -> dict:
    return yaml.load(text, Loader=matrix._Loader)  # noqa: S506 - the matrix's own SafeLoader: dates stay text


def test_the_committed_schema_is_current():
    assert COMMITTED.read_text() == schema.text(), "regenerate: build schema > docs/matrix.schema.json"


def test_the_schema_is_deterministic_sorted_and_ends_in_a_newline():
    text = schema.text()
    assert text == schema.text() and text.endswith("}\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_matrix_yaml_names_the_schema_on_its_first_line_and_validates_against_it():
    text = (REPO / "matrix.yaml").read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=docs/matrix.schema.json"
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in _validator().iter_errors(_raw(text))]
    assert errors == []


def test_the_schema_flags_what_the_matrix_refuses():
    raw = _raw((REPO / "matrix.yaml").read_text())
    cu129 = raw["targets"]["cu129"]
    bad = [
        {**cu129, "colour": "red"},  # an unknown key
        {**cu129, "name": "other"},  # the name is the key
        {**cu129, "image": {**cu129["image"], "registry": "bad host!"}},
        {**cu129, "bases": {**cu129["bases"], "build": "nvidia/cuda:12.9.1"}},  # not pinned by digest
        {**cu129, "compile": {**cu129["compile"], "env": {"lower": "x"}}},  # a key with a pattern
        {**cu129, "layers": [{"name": "cuda"}]},  # a list item is whole: match is required
    ]
    validator = _validator()
    for target in bad:
        assert list(validator.iter_errors({**raw, "targets": {"cu129": target}})), target
    assert list(validator.iter_errors({**raw, "defaults": {"colour": "red"}}))
    assert list(validator.iter_errors({"version": 1}))  # targets are required


def test_a_target_may_take_any_key_from_defaults():
    # The tool merges defaults: under each target key by key; the schema requires nothing there.
    raw = _raw((REPO / "matrix.yaml").read_text())
    cu129 = dict(raw["targets"]["cu129"])
    moved = {"source": cu129.pop("source"), "image": cu129.pop("image")}
    cu129["image"] = {"tag": "other"}  # the rest of image: from defaults.image
    doc = {**raw, "defaults": {**raw["defaults"], **moved}, "targets": {"cu129": cu129}}
    assert list(_validator().iter_errors(doc)) == []
    target = matrix.parse(yaml.safe_dump(doc), REPO / "matrix.yaml").target("cu129")  # and the matrix agrees
    assert (target.image.tag, target.image.repository) == ("other", moved["image"]["repository"])


def _checkout(tmp_path):
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    (tmp_path / "docs").mkdir()
    shutil.copy(COMMITTED, tmp_path / "docs" / "matrix.schema.json")
    return tmp_path


def _run(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_build_schema_prints_the_committed_text(capsys):
    code, out, _ = _run(capsys, "schema")
    assert code == 0 and out == COMMITTED.read_text()
    code, out, _ = _run(capsys, "--json", "schema")
    assert code == 0 and json.loads(out)["schema"] == json.loads(COMMITTED.read_text())


def test_schema_check_exits_1_on_drift_and_2_on_a_file_it_cannot_read(tmp_path, capsys):
    root = _checkout(tmp_path)
    assert _run(capsys, "schema", "--check", "--matrix", str(root / "matrix.yaml"))[:2] == (0, "")
    committed = root / "docs" / "matrix.schema.json"
    committed.write_text(committed.read_text().replace('"minItems": 1', '"minItems": 2', 1))
    code, out, err = _run(capsys, "schema", "--check", "--matrix", str(root / "matrix.yaml"))
    assert (code, out) == (1, "")
    assert "docs/matrix.schema.json: out of date; run `build schema > docs/matrix.schema.json`" in err
    committed.unlink()
    code, _, err = _run(capsys, "--json", "schema", "--check", "--matrix", str(root / "matrix.yaml"))
    assert code == 1 and "docs/matrix.schema.json: missing" in err
    committed.mkdir()
    assert _run(capsys, "schema", "--check", "--matrix", str(root / "matrix.yaml"))[0] == 2
