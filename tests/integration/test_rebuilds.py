"""Never pay for the same inputs twice: no-op builds, label-only rebuilds (the cache after a prune:
test_rebuilds_pruned.py)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from builder.config import contract
from builder.engine import buildlog
from tests.integration.conftest import cli
from tests.integration.enginelock import ignore_cache_hold
from tests.integration.test_app_layers import _commit, _pin


def _builds(root):
    return sorted(p for p in (root / "artifacts" / "smoke").iterdir() if (p / "build.log").exists())


def _latest_log(root) -> str:
    return (_builds(root)[-1] / "build.log").read_text()


def test_unchanged_inputs_do_no_engine_build(pristine, tmp_path):
    smoke, ref = pristine  # "up to date" needs the registry as the record says
    work = smoke.copy(tmp_path / "noop")
    before = work.record.read_bytes()
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 0, r.err[-2000:]
    assert "up to date" in r.err and r.out.strip() == ref
    assert not (work.root / "artifacts").exists()  # no context, no log: the engine was not asked
    assert work.record.read_bytes() == before
    forced = cli("--matrix", str(work.matrix), "--target", "smoke", "--force", "--no-checks")
    assert forced.code == 0 and "up to date" not in forced.err
    assert len(_builds(work.root)) == 1


def test_expiry_change_rebuilds_only_the_last_layers(built, tmp_path):
    smoke, ref = built
    work = smoke.copy(tmp_path / "expiry")
    text = work.matrix.read_text()
    old = re.search(r"expires: '?(\d{4}-\d{2}-\d{2})'?", text).group(1)
    new = old[:-2] + ("01" if old[-2:] != "01" else "02")
    work.matrix.write_text(text.replace(old, new))
    assert cli("--matrix", str(work.matrix), "render").code == 0
    # Alone with respect to builds that ignore the cache: BuildKit would run the steps this build
    # shares with one of them in flight, and the count below would measure that build, not this one.
    with ignore_cache_hold(exclusive=True):
        r = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks")
    assert r.code == 0, r.err[-2000:]
    log = _latest_log(work.root)
    steps = buildlog.steps(log)
    assert [s.stage for s in steps if s.instruction == "RUN"]
    assert not buildlog.ran(log), [s.stage for s in buildlog.ran(log)]  # every RUN cached
    new_ref = r.out.strip().splitlines()[-1]
    assert new_ref != ref  # a new image: only its config (the label) changed
    layers = [
        json.loads(
            subprocess.run(
                ["docker", "buildx", "imagetools", "inspect", "--raw", x], capture_output=True, text=True, check=True
            ).stdout
        )["layers"]
        for x in (ref, new_ref)
    ]
    assert layers[0] == layers[1]


def test_several_targets_at_once_with_one_summary(built, tmp_path):
    smoke, _ = built
    work = smoke.copy(tmp_path / "jobs")
    text = work.matrix.read_text()
    entry = text[text.index("  smoke:\n") :]
    twin = entry.replace("  smoke:\n", "  smoke-twin:\n", 1).replace("tag: smoke", "tag: twin")
    work.matrix.write_text(text + twin)
    assert cli("--matrix", str(work.matrix), "render").code == 0
    lock_dir = work.root / "locks"
    (lock_dir / "smoke-twin").mkdir()
    for name in ("requirements.txt", "build-requirements.txt", contract.OS_LOCK_NAME):
        if (lock_dir / "smoke" / name).exists():  # the OS lock is a function of the entry, not its name
            (lock_dir / "smoke-twin" / name).write_text((lock_dir / "smoke" / name).read_text())
    r = cli(
        "--matrix",
        str(work.matrix),
        "--target",
        "smoke",
        "--target",
        "smoke-twin",
        "--jobs",
        "2",
        "--force",
        "--no-checks",
    )
    assert r.code == 0, r.err[-3000:]
    assert len(r.out.strip().splitlines()) == 2
    assert "build summary" in r.err and "smoke" in r.err
    for target in ("smoke", "smoke-twin"):
        assert list((work.root / "artifacts" / target).glob("*/build.log"))
        assert json.loads((lock_dir / target / "image.json").read_text())["target"] == target
    assert "#1 [internal]" not in r.err  # logs stay in their files when builds run side by side


def _manifest_layers(ref: str) -> list[dict]:
    return json.loads(
        subprocess.run(
            ["docker", "buildx", "imagetools", "inspect", "--raw", ref], capture_output=True, text=True, check=True
        ).stdout
    )["layers"]


def test_source_only_bump_changes_exactly_the_app_layer(built, tmp_path):
    """Layers by rate of change: >= 3 layers above the base, and a new commit that touches only the
    source's Python re-pushes one of them (app-python); every dependency layer and app-native keep
    their digests. (test_app_layers.py does the same on a fresh builder, and a C-only bump.)"""
    smoke, ref = built
    work = smoke.copy(tmp_path / "bump")
    text = work.matrix.read_text()
    url, commit = re.search(
        r"\n      url: file://(\S+)\n      branch: \S+\n      commit: ([0-9a-f]{40})", text
    ).groups()
    clone = tmp_path / "src-clone"
    subprocess.run(["git", "clone", "-q", url, str(clone)], check=True)
    main_py = clone / "k3smoke" / "__main__.py"
    main_py.write_text(main_py.read_text() + "# a source-only bump\n")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
        "GIT_COMMITTER_DATE": "2026-11-03T00:00:00+00:00",
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(["git", "-C", str(clone), "commit", "-qam", "bump"], check=True, env=env)
    new_commit = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    work.matrix.write_text(
        text.replace(f"url: file://{url}\n", f"url: file://{clone}\n", 1).replace(
            f"commit: {commit}", f"commit: {new_commit}", 1
        )
    )
    for args in (("render",), ("lock", "--target", "smoke")):
        assert cli("--matrix", str(work.matrix), *args).code == 0
    r = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks")
    assert r.code == 0, r.err[-2000:]
    base = re.search(r"runtime: (\S+)", text).group(1)
    n_base = len(_manifest_layers(base))
    before, after = _manifest_layers(ref)[n_base:], _manifest_layers(r.out.strip().splitlines()[-1])[n_base:]
    assert len(before) == len(after) >= 3
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a["digest"] != b["digest"]]
    assert changed == [len(after) - 1]  # app-python is last: most changeable on top


# libwbclient0 as bookworm and bookworm-updates serve it (two versions, both served, a libc-only
# closure): the one OS package of these machines' archive with two versions small enough to build twice.
WBCLIENT = ("2:4.17.12+dfsg-0+deb12u4", "2:4.17.12+dfsg-0+deb12u2")


def test_an_os_package_version_change_changes_exactly_the_os_layer(built, tmp_path):
    """Layers by rate of change: the OS packages sit right above the base; moving one package's
    version re-pushes that layer and no other (every Python layer and the app keep their digests)."""
    smoke, _ = built
    images = []
    for i, version in enumerate(WBCLIENT):
        extra = (
            f"      - name: libwbclient0\n        why: a package whose version moves\n        version: '{version}'\n"
        )
        work = smoke.variant(
            tmp_path / f"os{i}",
            f"os{i}",
            lambda t, extra=extra: t.replace("      - name: numactl\n", extra + "      - name: numactl\n", 1),
        )
        locked = cli("--matrix", str(work.matrix), "lock", "--target", "smoke")
        if locked.code == 2 and "apt cannot install" in locked.err:
            pytest.skip(f"the Debian archive no longer serves libwbclient0 {version}: pick another pair")
        assert locked.code == 0, locked.err[-2000:]
        assert f"libwbclient0 {version} " in (work.root / "locks/smoke/os-packages.txt").read_text()
        r = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks")
        assert r.code == 0, r.err[-2000:]
        images.append(r.out.strip().splitlines()[-1])
    base = re.search(r"runtime: (\S+)", smoke.matrix.read_text()).group(1)
    n_base = len(_manifest_layers(base))
    before, after = (_manifest_layers(ref)[n_base:] for ref in images)
    assert len(before) == len(after) >= 4
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a["digest"] != b["digest"]]
    assert changed == [0]  # the OS layer, first above the base: least changeable at the bottom


def test_two_commits_of_one_date_differing_by_a_same_size_edit_each_build_their_own_bytes(built, tmp_path):
    """BuildKit keeps a synced copy of each local input and sends only the files whose size, mtime,
    mode or owner differ; every input of the tool carries SOURCE_DATE_EPOCH as its mtime, and two
    commits of one date differ here only by same-size edits (this file, .git_archival.txt). Each
    build must still compile and ship its own commit's bytes (builder/engine/localsync.py)."""
    smoke, _ = built
    work = smoke.variant(tmp_path / "samesize", "samesize")
    url = re.search(r"\n      url: file://(\S+)\n", work.matrix.read_text()).group(1)
    clone = tmp_path / "src"
    subprocess.run(["git", "clone", "-q", url, str(clone)], check=True)
    work.matrix.write_text(work.matrix.read_text().replace(f"url: file://{url}\n", f"url: file://{clone}\n", 1))
    main = clone / "k3smoke" / "__main__.py"
    original = main.read_text()
    pins = {}
    for side in "AB":  # each the original file plus one line of one length, committed at one date
        main.write_text(original)
        pins[side] = _commit(clone, "k3smoke/__main__.py", f"# sync-{side}\n", "2026-11-05T00:00:00+00:00")
    shipped = {}
    for side, commit in pins.items():  # A, then B right after it: B's sync would find A's tree
        _pin(work, commit)
        r = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks")
        assert r.code == 0, r.err[-2000:]
        image = r.out.strip().splitlines()[-1]
        shipped[side] = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                "--entrypoint",
                "sh",
                image,
                "-c",
                "tail -n 1 /opt/k3/venv/lib/python3*/site-packages/k3smoke/__main__.py",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert shipped == {"A": "# sync-A\n", "B": "# sync-B\n"}
