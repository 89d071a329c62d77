"""The chain `build verify` checks, as data: every row it prints, in order, and when each holds.
Each row is one link in matrix <-> Dockerfile <-> lock <-> image.json <-> SBOM <-> provenance
(<-> registry); builder/records/verify.py checks them, and the verify table of docs/auditor.md is made from
this list (`table_markdown`).
"""

from __future__ import annotations

# Every row `build verify` prints, in order: (row, holds when, only with --registry). The
# verify table is this list (tests/unit/test_provsign.py compares them).
ROWS: tuple[tuple[str, str, bool], ...] = (
    ("matrix <-> Dockerfile", "the committed Dockerfile is exactly what the matrix renders", False),
    (
        "lock hash-pinned",
        "each lock matches its own body sha256 header (`k3-lock-body-sha256`: not truncated or "
        "hand-edited), every line is `name==version` with sha256 hashes; for a torch target, torch "
        "is `+cu129`",
        False,
    ),
    (
        "image.json <-> audit files",
        "the SBOM and provenance files are the ones `image.json` names by sha256 "
        "(`build.sbom_sha256`, `build.provenance_sha256`) and describe its digest",
        False,
    ),
    (
        "image checks",
        "the recorded image passed its checks before it was recorded (`checks` is `passed`, not "
        "`skipped` by `--no-checks`)",
        False,
    ),
    ("Dockerfile <-> image.json", "the Dockerfile's sha256 is the recorded one", False),
    (
        "lock <-> image.json",
        "both locks' sha256 are the recorded ones, and `wheel_records` (where recorded) holds a RECORD "
        "digest for each runtime lock entry at its version, and for nothing else",
        False,
    ),
    (
        "matrix <-> image.json",
        "target, image name, base digests, source URL and commit, third-party trees match the matrix; "
        "for a target with `gpu` whose checks ran, the record's `gpu` claims the matrix's driver floor "
        "and families (the labels' values), its derived floor is at most that floor and every required "
        "extension is served on every family",
        False,
    ),
    (
        "image.json <-> SBOM",
        "the SBOM validates (CycloneDX 1.6, strict) and describes the recorded digest, bases, "
        "commit and third-party trees",
        False,
    ),
    (
        "lock <-> SBOM",
        "every lock entry is in the SBOM with the same version, and its one hash (the installed "
        "wheel's) is one of the lock's",
        False,
    ),
    (
        "image.json <-> provenance",
        "the envelope's Statement: subject and every resolved dependency match the record (`wheel-records`: "
        "the sha256 of `wheel_records`, so an edited digest fails here), "
        "`externalParameters` the matrix, `buildType` and `builder.id` the expected "
        "identities, `builderDependencies` name this repository",
        False,
    ),
    (
        "provenance signed",
        "the DSSE envelope carries a signature; with no `signing.key`/`public_key` in the "
        "matrix it holds with an UNSIGNED warning; with a `public_key` an unsigned envelope fails",
        False,
    ),
    (
        "provenance signer",
        "every signature's key id is the matrix's `signing.public_key`'s (a wrong key fails here)",
        False,
    ),
    (
        "provenance signature",
        "the signature by that key verifies, offline, over DSSE's pre-authentication encoding "
        "of the payload (an edited payload fails here)",
        False,
    ),
    ("registry: image", "the registry serves the recorded digest and the tag points at it", True),
    ("registry: SBOM + provenance", "both are attached to that digest and equal the committed files", True),
    (
        "registry: signature",
        "`verified`: cosign (on PATH) verified a keyless signature on the recorded digest by "
        "the identity in `K3_SIGNING_IDENTITY` or the matrix's `signing.identity`, issuer "
        "`K3_SIGNING_ISSUER` / `signing.issuer` (default GitHub Actions'); "
        "`present-unverified`: a signature is there (cosign's `.sig` tag or a signature "
        "referrer) but no cosign or no identity to check it (holds, and says so); `missing`: "
        "fails when an identity is configured, holds otherwise (local and smoke registries); "
        "`failed`: cosign rejected it or the registry could not be read. GitHub's provenance "
        "attestation is not counted as a signature",
        True,
    ),
)


# Rows only a target with os_packages has (builder/deps/oslock.py), after the other offline rows.
OS_ROWS: tuple[tuple[str, str, bool], ...] = (
    (
        "OS lock hash-pinned",
        "(targets with `os_packages`) `os-packages.txt` matches its body sha256 header, every "
        "line parses, and it was made from the matrix's package list, archive and runtime base "
        "(inputs sha256)",
        False,
    ),
    ("OS lock <-> image.json", "its sha256 is the recorded `os_lock_sha256`", False),
    (
        "OS lock <-> SBOM",
        "every `.deb` of the lock is in the SBOM as `pkg:deb` with the same version, `arch` and its "
        "one sha256 (an edited lock or a swapped `.deb` fails here)",
        False,
    ),
)


def all_rows(os_packages: bool = True) -> list[tuple[str, str, bool]]:
    """ROWS with the OS lock's rows after the offline ones, for a target with os_packages."""
    return [r for r in ROWS if not r[2]] + (list(OS_ROWS) if os_packages else []) + [r for r in ROWS if r[2]]


def table_markdown() -> str:
    """The verify table of docs/auditor.md, made from ROWS (and OS_ROWS)."""
    lines = ["| row | holds when |", "| --- | --- |"]
    lines += [f"| `{name}`{' (`--registry`)' if registry else ''} | {when} |" for name, when, registry in all_rows()]
    return "\n".join(lines) + "\n"
