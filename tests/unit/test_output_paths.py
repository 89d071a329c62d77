"""`doctor --record` and `evidence --out` on bad paths (issue 32): one line and the right exit code,
never a traceback; and a second run within the same second never replaces the first."""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path

import pytest

from builder import cli
from builder.errors import ConfigError
from builder.fsutil import reserve_stem, written
from builder.host import doctor, evidence
from tests.unit.test_doctor import SMI, _NoDocker, _record


def _run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            cli.main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


def test_a_record_directory_under_a_file_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"--record .*/file/sub: cannot make the directory: Not a directory"):
        doctor.output_dir(tmp_path / "file" / "sub", "--record")
    with pytest.raises(ConfigError, match=r"--out .*/file/sub: cannot make the directory"):
        evidence.evidence(_NoDocker(), tmp_path / "file" / "sub", None, None, environ={})
    code, err = _run(
        "doctor", "--image", "img:1", "--nvidia-smi-file", str(SMI / "r575-h100.txt"), "--record", f"{tmp_path}/file/x"
    )
    assert code == 2 and "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [
        f"error: --record {tmp_path}/file/x: cannot make the directory: Not a directory"
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0500 directory anyway")
def test_an_unwritable_record_directory_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="not writable by this user"):
        doctor.output_dir(locked, "--record")
    with pytest.raises(ConfigError, match="cannot make the directory: Permission denied"):
        doctor.output_dir(locked / "sub", "--record")


def test_a_write_that_fails_after_the_check_is_bad_input_and_a_full_disk_stays_a_resource():
    def gone():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/k3-decision.md")

    with pytest.raises(ConfigError, match=r"^--record /x: cannot write /x/k3-decision\.md: No such file"):
        written(gone, "--record /x")

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as err:  # cli maps it to exit 74 (HostResources)
        written(full, "--record /x")
    assert err.value.errno == errno.ENOSPC


def test_two_records_in_the_same_second_are_both_kept(tmp_path):
    _, doc = _record("r565-8xh100-table.txt")
    first_md, first_js = doctor.write_decision(tmp_path, doc)
    first = first_md.read_bytes()
    second_md, second_js = doctor.write_decision(tmp_path, doc)
    assert second_md != first_md and second_js != first_js and second_md.stem == first_md.stem + "-2"
    assert first_md.read_bytes() == first and second_md.read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [first_md.name, first_js.name, second_md.name, second_js.name]
    )
    assert os.stat(second_md).st_mode & 0o777 == 0o644  # the placeholder is replaced, not kept


def test_a_reserved_stem_skips_names_any_suffix_already_has(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    assert reserve_stem(tmp_path, "a", (".md", ".json")) == "a-2"
    assert not (tmp_path / "a.md").exists()  # the half-reserved pair is given back
    assert reserve_stem(tmp_path, "a", (".md", ".json")) == "a-3"
    assert Path(tmp_path / "a-2.md").exists() and Path(tmp_path / "a-3.json").exists()


def test_the_markdown_record_carries_no_control_character_from_a_capture(tmp_path):
    """Issue 32: text read from a capture file (a GPU name, a driver line) reached the Markdown
    record and, printed, the terminal with its escape sequences."""
    _, doc = _record("r565-8xh100-table.txt")
    hostile = "NVIDIA H100\x1b]0;owned\x07\x1b[2J\u202e"
    doc = {**doc, "image": f"img:1{hostile}", "fault_evidence": {**doc["fault_evidence"], "route": hostile}}
    md, js = doctor.write_decision(tmp_path, doc)
    text = md.read_text()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "img:1NVIDIA H100\\x1b]0;owned\\x07\\x1b[2J\\u202e" in text
    assert "\\u001b" in js.read_text()  # JSON escapes them itself
