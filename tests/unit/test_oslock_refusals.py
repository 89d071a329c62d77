"""The OS lock's reading rules pinned exactly (builder/deps/oslock.py, issue 38): trailing text
after a valid line is refused wherever the line is (first, middle, last, with or without a final
newline), naming the exact line number; a garbled hash in the header or in a line (wrong length,
not hex, upper case) is refused; a header line is only a header before the body; and what the user
sees: one line on stderr naming the file and what is wrong, exit 2 (LockError: bad input)."""

from __future__ import annotations

import pytest

from builder import cli
from builder.commands import parser as commands_parser
from builder.deps import oslock
from builder.deps.lock import BODY_HEADER, INPUT_HEADER
from builder.errors import LockError
from builder.fsutil import sha256_bytes
from tests.unit.test_oslock import _cu129, _out, _parse

GOOD = (
    "libnuma1 2.0.16-1 amd64 http://deb.debian.org/debian/pool/main/n/numactl/libnuma1_2.0.16-1_amd64.deb "
    "38432 sha256:" + "1" * 64
)
OTHER = GOOD.replace("libnuma1", "numactl").replace("1" * 64, "2" * 64)
MESSAGE = "not 'name version arch url size sha256:<hex>': "


def lock(body: str, *, comments: int = 1, inputs: str = "a" * 64, body_sha: str | None = None) -> str:
    """A lock with ``comments`` comment lines, then the two hash headers, then ``body``."""
    head = "".join(f"# comment {i}\n" for i in range(comments))
    return head + f"{INPUT_HEADER}{inputs}\n{BODY_HEADER}{body_sha or sha256_bytes(body.encode())}\n" + body


def refused(text: str, path) -> str:
    with pytest.raises(LockError) as err:
        oslock.parse(text, path)
    assert err.value.exit_code == 2
    assert "\n" not in err.value.message
    return err.value.message


# --- trailing text after a valid line --------------------------------------------------------------


@pytest.mark.parametrize("comments", [0, 1, 3])
@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("trailing", [" x", " ", "\t", " sha256:" + "1" * 64, "#c", "  # comment"])
def test_trailing_text_after_a_valid_line_is_refused_naming_that_line(tmp_path, comments, position, trailing):
    lines = [GOOD, OTHER, GOOD.replace("libnuma1", "libnuma-dev")]
    lines[position] += trailing
    path = tmp_path / "os-packages.txt"
    message = refused(lock("\n".join(lines) + "\n", comments=comments), path)
    lineno = comments + 2 + position + 1  # the comments, the two headers, then the body lines
    assert message == f"{path}:{lineno}: {MESSAGE}{lines[position][:60]!r}"


def test_trailing_text_on_a_last_line_without_a_newline_is_refused(tmp_path):
    path = tmp_path / "os-packages.txt"
    assert refused(lock(f"{GOOD}\n{GOOD} extra", comments=2), path) == f"{path}:6: {MESSAGE}{(GOOD + ' extra')[:60]!r}"
    _, entries = oslock.parse(lock(f"{GOOD}\n{OTHER}", comments=2), path)  # no final newline: fine
    assert [e.name for e in entries] == ["libnuma1", "numactl"]


def test_the_valid_lines_parse_exactly_and_in_order(tmp_path):
    inputs, entries = oslock.parse(lock(f"{GOOD}\n{OTHER}\n", comments=3), tmp_path / "x")
    assert inputs == "a" * 64
    assert [e.line() for e in entries] == [GOOD, OTHER]
    assert [(e.name, e.size, e.sha256) for e in entries] == [
        ("libnuma1", 38432, "1" * 64),
        ("numactl", 38432, "2" * 64),
    ]


# --- a garbled hash -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "digest",
    ["1" * 63, "1" * 65, "g" + "1" * 63, "A" * 64, "1" * 32 + " " + "1" * 31, ""],
    ids=["63", "65", "non-hex", "upper", "space", "empty"],
)
def test_a_garbled_sha256_in_a_line_is_refused(tmp_path, digest):
    path = tmp_path / "os-packages.txt"
    line = GOOD[:-64] + digest
    assert refused(lock(f"{OTHER}\n{line}\n"), path) == f"{path}:5: {MESSAGE}{line[:60]!r}"


@pytest.mark.parametrize(
    "garbled",
    ["0" * 63, "0" * 65, "z" * 64, "", "sha256:{}"],
    ids=["63", "65", "non-hex", "empty", "prefixed"],
)
def test_a_garbled_body_hash_header_is_refused(tmp_path, garbled):
    body = GOOD + "\n"
    right = sha256_bytes(body.encode())
    path = tmp_path / "os-packages.txt"
    message = refused(lock(body, body_sha=garbled.format(right) or " "), path)
    assert message == (
        f"{path}: the lock's body does not match its {BODY_HEADER.strip()} header (truncated or edited by hand); "
        "restore it from git or re-run `build lock`"
    )
    # the right hash with one more or one less character is as wrong as any other
    for near in (right[:-1], right + "0", right.upper()):
        assert "does not match its" in refused(lock(body, body_sha=near), path)
    assert oslock.parse(lock(body, body_sha=right), path)[1][0].line() == GOOD


@pytest.mark.parametrize("garbled", ["x" * 64, "", "0" * 63], ids=["non-hex", "empty", "short"])
def test_a_garbled_inputs_hash_is_stale(tmp_path, garbled):
    t, path = _cu129(), tmp_path / "os-packages.txt"
    right = oslock.inputs_sha256(t)
    with pytest.raises(LockError) as err:
        oslock.check_inputs(garbled or None, path, t)
    assert err.value.exit_code == 2 and err.value.message.startswith(f"{path}: stale: ")
    for near in (right[:-1], right + "0", right.upper()):
        with pytest.raises(LockError):
            oslock.check_inputs(near, path, t)
    oslock.check_inputs(right, path, t)


def test_a_header_line_after_the_body_starts_is_a_body_line(tmp_path):
    """Headers are the leading '# ' lines only: a hash header after a package line is no header."""
    path = tmp_path / "os-packages.txt"
    body = f"{GOOD}\n{BODY_HEADER}{'0' * 64}\n"
    assert refused(lock(body), path) == f"{path}:5: {MESSAGE}{(BODY_HEADER + '0' * 64)[:60]!r}"


def test_no_body_header_at_all_is_refused_before_the_lines(tmp_path):
    path = tmp_path / "os-packages.txt"
    assert refused(f"# c\n{INPUT_HEADER}{'a' * 64}\n{GOOD} trailing\n", path) == (
        f"{path}: no '{BODY_HEADER.strip()}' header; re-run `build lock`"
    )


# --- what the user sees -----------------------------------------------------------------------------


def test_a_garbled_lock_is_one_line_on_stderr_and_exit_2(tmp_path, monkeypatch, capsys):
    """Through the command line's own mapping (cli.main): the command reads the lock, the LockError
    becomes one line naming the file and the line, and exit code 2."""
    path = tmp_path / "cu129" / "os-packages.txt"
    path.parent.mkdir()
    bad = GOOD + " trailing"
    path.write_text(lock(bad + "\n"))

    def reads_the_lock(args, out):
        oslock.read(path)
        return 0

    monkeypatch.setitem(commands_parser.COMMANDS, "plan", reads_the_lock)
    monkeypatch.setattr(cli, "COMMANDS", commands_parser.COMMANDS)
    with pytest.raises(SystemExit) as info:
        cli.main(["plan"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}:4: {MESSAGE}{bad[:60]!r}\n"


# --- the archive index's Filename, exactly (what the error shows) -------------------------------------

GOOD_POOL = "pool/main/n/numactl/numactl_2.0.14-3ubuntu2_amd64.deb"
WHERE = "targets.cu129.os_packages"


@pytest.mark.parametrize(
    ("filename", "shown"),
    [
        ("dists/x.deb", "dists/x.deb"),
        ("pool/" + "d" * 70 + " .deb", ("pool/" + "d" * 70 + " .deb")[:60]),  # cut at 60 characters
        (None, ""),  # no Filename field at all
    ],
    ids=["not-pool", "long", "missing"],
)
def test_a_bad_index_filename_is_shown_exactly_cut_at_sixty(filename, shown):
    line = f"K3-PKG Filename: {GOOD_POOL}\n"
    out = _out().replace(line, "" if filename is None else f"K3-PKG Filename: {filename}\n")
    with pytest.raises(LockError) as err:
        _parse(out)
    assert err.value.message == f"{WHERE}: numactl: unexpected Filename {shown!r} in the index"
    assert err.value.exit_code == 2
