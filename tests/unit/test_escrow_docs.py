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
