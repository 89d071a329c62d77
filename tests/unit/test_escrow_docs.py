"""docs/auditor.md says what the escrow is: its verify row as builder/escrow/check.py states it,
and every media type builder/escrow/manifest.py pushes (no registry needed)."""

from __future__ import annotations

from builder.escrow import check
from builder.escrow import manifest as em
from tests.conftest import REPO

AUDITOR = (REPO / "docs" / "auditor.md").read_text()


def test_the_verify_table_has_the_escrow_row_as_the_code_states_it():
    assert f"| `{check.ROW}` (`--registry`) | {check.HOLDS_WHEN} |\n" in AUDITOR


def test_every_media_type_the_escrow_pushes_is_documented():
    types = [t for pair in em.MEDIA.values() for t in pair]
    types += [em.INDEX_TYPE, em.MANIFEST_TYPE, em.DSSE_MEDIA, em.PREDICATE_TYPE, em.KEY, em.TITLE]
    assert [t for t in types if f"`{t}`" not in AUDITOR] == []


HAND_REBUILD = AUDITOR.split("<!-- hand-rebuild:begin -->", 1)[1].split("<!-- hand-rebuild:end -->", 1)[0]


def test_the_hand_rebuild_names_each_input_by_the_key_the_escrow_gives_it():
    """The block looks inputs up by key in shell ($name, $commit, ...): the same shapes inputs.py
    writes, so a renamed key fails here and not first in an auditor's hands."""
    from builder.deps.oslock import DebEntry
    from builder.escrow import inputs as ei

    keys = [
        ei.RecipeInput("$f", "").key,
        ei.BaseInput("$role", "$P", "", "").key,
        ei.WheelInput("$1", "$name", "$version", ()).key,
        ei.DebInput("", DebEntry("$name", "$version", "$arch", "", 0, "")).key.replace(
            "deb  ", "deb $L/os-packages.txt "
        ),
        ei.PythonInput("$P", "", "").key,
        ei.SourceInput("source", "", "$SRC").key,
        ei.SourceInput("third_party/$name", "", "$commit").key,
        ei.SourceInput("third_party/$name/$path", "", "$sub").key,
    ]
    assert [k for k in keys if f'"{k}' not in HAND_REBUILD] == []


def test_the_hand_rebuild_copies_every_script_a_dockerfile_can_name():
    from builder.config import contract

    assert [p for p, name in contract.CONTEXT_SCRIPTS.items() if f"{p}) s={name};;" not in HAND_REBUILD] == []
