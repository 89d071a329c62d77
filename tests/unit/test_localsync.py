"""The default context reaches buildx under a name keyed by every local input's bytes
(builder/engine/localsync.py): BuildKit's sync compares metadata only, and the tool's inputs all
carry one mtime, so two builds of different bytes must never share a synced copy."""

from __future__ import annotations

import os
from pathlib import Path

from builder.engine import localsync
from builder.engine.seam import BuildRequest

EPOCH = 1793491200


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (EPOCH, EPOCH), follow_symlinks=False)
    return root


def _request(tmp: Path, context: Path, source: Path) -> BuildRequest:
    dockerfile = tmp / "Dockerfile"
    dockerfile.write_text("FROM scratch\n")
    return BuildRequest(
        context=context, dockerfile=dockerfile, tags=("t",), build_args={}, build_contexts={"source": source}
    )


def test_a_same_size_edit_at_one_mtime_changes_the_digest(tmp_path):
    a = _tree(tmp_path / "a", {".git_archival.txt": "node: " + "a" * 40 + "\n", "k/m.py": "x = 1\n"})
    b = _tree(tmp_path / "b", {".git_archival.txt": "node: " + "b" * 40 + "\n", "k/m.py": "x = 1\n"})
    assert [p.stat().st_size for p in sorted(a.rglob("*"))] == [p.stat().st_size for p in sorted(b.rglob("*"))]
    assert localsync.inputs_digest([("source", a)]) != localsync.inputs_digest([("source", b)])


def test_the_same_bytes_anywhere_and_at_any_mtime_give_one_digest(tmp_path):
    a = _tree(tmp_path / "a", {"x": "1", "d/y": "2"})
    b = _tree(tmp_path / "elsewhere" / "b", {"x": "1", "d/y": "2"})
    os.utime(b / "x", (0, 0))
    assert localsync.inputs_digest([("source", a)]) == localsync.inputs_digest([("source", b)])
    # ... but not under another input's name, nor with a file moved between directories.
    assert localsync.inputs_digest([("source", a)]) != localsync.inputs_digest([("tp-x", a)])
    c = _tree(tmp_path / "c", {"x": "1", "d/z/y": "2"})
    assert localsync.inputs_digest([("source", a)]) != localsync.inputs_digest([("source", c)])


def test_a_link_target_and_a_mode_are_part_of_the_digest(tmp_path):
    a = _tree(tmp_path / "a", {"f": "1"})
    before = localsync.inputs_digest([("source", a)])
    (a / "l").symlink_to("f")
    linked = localsync.inputs_digest([("source", a)])
    (a / "l").unlink()
    (a / "l").symlink_to("g")
    assert len({before, linked, localsync.inputs_digest([("source", a)])}) == 3
    (a / "l").unlink()
    (a / "f").chmod(0o755)
    assert localsync.inputs_digest([("source", a)]) != before


def test_keyed_context_is_a_link_named_by_the_digest_removed_after(tmp_path):
    context = _tree(tmp_path / "build" / "context", {"requirements.txt": "a==1 --hash=sha256:" + "0" * 64 + "\n"})
    source = _tree(tmp_path / "build" / "source", {"m.py": "x = 1\n"})
    req = _request(tmp_path / "build", context, source)
    with localsync.keyed_context(req) as link:
        assert link.is_symlink() and link.resolve() == context.resolve()
        assert (link / "requirements.txt").read_text().startswith("a==1")
        digest = localsync.inputs_digest([("context", context), ("dockerfile", req.dockerfile), ("source", source)])
        assert link.name == localsync.PREFIX + digest[:32]
        first = link.name
    assert not link.parent.exists() and context.is_dir() and (context / "requirements.txt").exists()
    # A same-size edit of the lock (one hash digit), mtimes unchanged: another name, another copy.
    lock = context / "requirements.txt"
    lock.write_text(lock.read_text().replace("0" * 64, "1" + "0" * 63))
    os.utime(lock, (EPOCH, EPOCH))
    with localsync.keyed_context(req) as link:
        assert link.name != first
    # The Dockerfile is an input too.
    req.dockerfile.write_text("FROM scratch\n".replace("scratch", "scratcH"))
    with localsync.keyed_context(req) as again:
        assert again.name != link.name


class _Buildx:
    """python-on-whales' buildx as the engine calls it: records the default context it was given
    (and what it resolved to while the build ran), writes buildx's metadata file, logs one line."""

    def __init__(self) -> None:
        self.seen: list[tuple[Path, Path]] = []

    def build(self, context, **kw):
        self.seen.append((Path(context), Path(context).resolve()))
        Path(kw["metadata_file"]).write_text('{"containerimage.config.digest": "sha256:' + "0" * 64 + '"}')
        return iter(["#1 DONE 0.0s\n"])


def test_the_engine_hands_buildx_the_keyed_link_and_removes_it(tmp_path):
    from types import SimpleNamespace

    from builder.engine.buildx import DockerEngine

    fake = _Buildx()
    engine = DockerEngine(docker=SimpleNamespace(buildx=fake))  # type: ignore[arg-type]
    build = tmp_path / "build"
    req = _request(build, _tree(build / "context", {"a.txt": "1"}), _tree(build / "source", {"m.py": "x"}))
    for text in ("1", "2"):  # a same-size edit at the same mtime: another name
        (req.context / "a.txt").write_text(text)
        os.utime(req.context / "a.txt", (EPOCH, EPOCH))
        assert engine.build(req, build / "build.log", lambda line: None).digest == "sha256:" + "0" * 64
    (first, first_target), (second, second_target) = fake.seen
    assert first.name.startswith(localsync.PREFIX) and second.name.startswith(localsync.PREFIX)
    assert first.name != second.name and first_target == second_target == req.context.resolve()
    assert not first.exists() and not first.parent.exists() and (req.context / "a.txt").read_text() == "2"


def test_one_input_cannot_run_on_into_the_next_input_s_name(tmp_path):
    """The reviewer's pair: a file and a directory named like the mode line of a link, against the
    same file with that link beside it; one flat hash of every entry gave both the same digest."""
    one, two = tmp_path / "one", tmp_path / "two"
    _tree(one / "source", {"f": "1"})
    (one / "tp-a").mkdir()
    (one / "tp-a" / "120000 777").mkdir()
    _tree(two / "source", {"f": "1"})
    (two / "source" / "tp-a").symlink_to("40000 755")
    first = localsync.inputs_digest([("source", one / "source"), ("tp-a", one / "tp-a")])
    assert first != localsync.inputs_digest([("source", two / "source")])
