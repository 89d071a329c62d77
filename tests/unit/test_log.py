"""Redaction: registered secret values and credentials in URLs never reach a printed line."""

from __future__ import annotations

import pytest

from builder import log


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    """Each test starts with nothing registered (the registry is process-wide)."""
    monkeypatch.setattr(log, "_secrets", set())


def test_nothing_registered_changes_nothing():
    line = "#7 0.5 fetching https://pypi.org/simple/torch/ as deploy"
    assert log.redact(line) == line


def test_a_registered_value_is_redacted_wherever_it_appears():
    log.register_secret("hf_0123456789abcdef")
    assert log.redact("token hf_0123456789abcdef, again hf_0123456789abcdef.") == "token ***, again ***."
    assert log.redact("hf_0123456789abcde") == "hf_0123456789abcde"  # a prefix is not the value


def test_a_value_is_registered_without_its_surrounding_whitespace():
    log.register_secret("  s3cr3t-value\n")
    assert log.redact("got s3cr3t-value") == "got ***"


def test_a_multi_line_value_is_registered_line_by_line():
    netrc = "machine pypi.internal.example\nlogin deploy\npassword s3cr3t-Pa55word\n"
    log.register_secret(netrc)
    # Output is redacted one line at a time, so each line of the value must be caught alone.
    assert log.redact("login deploy") == "***"
    assert log.redact("  password s3cr3t-Pa55word  ") == "  ***  "
    assert log.redact("machine pypi.internal.example") == "***"
    # ... and each credential-looking word on its own, wherever it shows up.
    assert log.redact("curl: using s3cr3t-Pa55word for pypi.internal.example") == "curl: using *** for ***"


def test_credential_looking_words_need_length_and_a_non_letter():
    log.register_secret("password s3cr3t-Pa55word\nusername deployer\nkey ab1")
    assert log.redact("s3cr3t-Pa55word") == "***"  # 15 characters, digits and a symbol
    # Plain words (letters only) are not credentials on their own: the English word stays readable.
    assert log.redact("the password was rotated") == "the password was rotated"
    assert log.redact("deployer") == "deployer"
    # Short words are never registered alone ("ab1" is 3 characters), nor words of 7.
    assert log.redact("ab1 x") == "ab1 x"


def test_an_eight_character_word_with_a_digit_is_registered_and_seven_is_not():
    log.register_secret("first line\nuse pa55word or pa55wrd")
    assert log.redact("pa55word") == "***"  # exactly 8
    assert log.redact("pa55wrd") == "pa55wrd"  # 7: too short to be taken alone


def test_tiny_values_are_never_registered():
    log.register_secret("abc")  # 3 characters: redacting it would shred every line
    assert log.redact("abcdef abc") == "abcdef abc"
    log.register_secret("abcd")  # 4 characters is the minimum
    assert log.redact("xabcdx") == "x***x"


def test_the_longest_value_is_redacted_first():
    log.register_secret("token")
    log.register_secret("token-0123456789")
    # Replacing the short value first would leave "***-0123456789" behind.
    assert log.redact("token-0123456789") == "***"


@pytest.mark.parametrize(
    "url,expected",
    [
        ("https://user:pa55@pypi.internal.example/simple", "https://***@pypi.internal.example/simple"),
        ("https://tok3n@github.com/o/r.git", "https://***@github.com/o/r.git"),
        ("git+ssh://git:x@host/r", "git+ssh://***@host/r"),
        ("HTTPS://U:P@HOST/x", "HTTPS://***@HOST/x"),
    ],
)
def test_credentials_in_urls_are_redacted(url, expected):
    assert log.redact(f"fetching {url} now") == f"fetching {expected} now"


def test_urls_without_credentials_and_e_mail_addresses_stay():
    text = "https://pypi.org/simple/ and owner gpu-platform@example.org and http://127.0.0.1:5000/v2/"
    assert log.redact(text) == text


def test_info_warn_and_raw_lines_are_redacted(capsys):
    log.register_secret("hf_0123456789abcdef")
    log.info("info hf_0123456789abcdef")
    log.warn("warn https://u:p@h/x")
    log.quiet_build_output(False)
    log.raw("raw hf_0123456789abcdef")
    err = capsys.readouterr().err
    assert "hf_0123456789abcdef" not in err and "u:p@" not in err
    assert "info ***" in err and "warning: warn https://***@h/x" in err and "raw ***" in err


def test_raw_output_can_be_quieted(capsys):
    log.quiet_build_output(True)
    try:
        log.raw("a build line")
    finally:
        log.quiet_build_output(False)
    assert capsys.readouterr().err == ""
    log.raw("a build line")
    assert capsys.readouterr().err == "a build line\n"


def test_a_long_credential_url_is_redacted_before_it_is_cut():
    """Cut to 60 characters first, the '@' was lost and the password printed (issue 21)."""
    url = "https://deploy:" + "p4ssw0rd-very-long-" * 4 + "@index.example.org/simple"
    shown = log.shown(url)
    assert "p4ssw0rd" not in shown and len(shown) <= 60
    assert shown.startswith("'https://***@index.example.org")


@pytest.mark.parametrize(
    "text",
    [
        "K3_REGISTRY=deploy:s3cretpw@registry.example.org:5000",
        "registry deploy:s3cretpw@127.0.0.1:5000 refused",
        "'deploy:s3cretpw@host'",
    ],
)
def test_user_and_password_without_a_scheme_are_a_credential(text):
    assert "s3cretpw" not in log.redact(text) and "***@" in log.redact(text)


@pytest.mark.parametrize(
    "text",
    [
        "ubuntu:22.04@sha256:" + "a" * 64,
        "ghcr.io/o/r:tag@sha256:" + "b" * 64,
        "mail me: smoke@example.org",
        "git@github.com:org/repo",
    ],
)
def test_image_references_and_addresses_are_not_credentials(text):
    assert log.redact(text) == text


def test_every_written_form_of_a_secret_is_registered_and_listed():
    log.register_secret_forms("ATKPASS'q9x7Z", ("'ATKPASS'\"'\"'q9x7Z'",))
    assert log.redact("SCCACHE_REDIS_PASSWORD='ATKPASS'\"'\"'q9x7Z'") == "SCCACHE_REDIS_PASSWORD=***"
    assert {"ATKPASS'q9x7Z", "'ATKPASS'\"'\"'q9x7Z'"} <= log.secret_values()


HOSTILE = "ok \x1b]52;c;ZWNobyBoaQ==\x07 \x1b[2J\x1b[1A\rfake\x08\x9b31m \u202eevil\u2066 \x00\x7f"


def test_control_characters_become_visible_escapes_and_text_stays():
    shown = log.printable(HOSTILE + "\tcol\nnext é 日本")
    assert shown == (
        "ok \\x1b]52;c;ZWNobyBoaQ==\\x07 \\x1b[2J\\x1b[1A\\x0dfake\\x08\\x9b31m \\u202eevil\\u2066 \\x00\\x7f\tcol\nnext é 日本"
    )


def test_info_warn_raw_and_result_lines_carry_no_control_character(capsys):
    """Issue 32: build output (upstream code runs in the build) and commit subjects reached the
    terminal with their escape sequences."""
    from builder.commands._common import Output

    log.quiet_build_output(False)
    log.info(HOSTILE)
    log.warn(HOSTILE)
    log.raw(HOSTILE)
    Output(json_mode=False).line(HOSTILE)
    captured = capsys.readouterr()
    for text in (captured.err, captured.out):
        assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in text), repr(text)
        assert "\u202e" not in text and "\\x1b]52" in text


def test_the_job_summary_is_appended_redacted_and_only_when_github_sets_it(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    log.step_summary("| a |\n")
    assert not summary.exists()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    log.register_secret("hf_0123456789abcdef")
    log.step_summary("first\n")
    log.step_summary("token hf_0123456789abcdef\n")
    assert summary.read_text() == "first\ntoken ***\n"


def test_step_times_are_appended_to_the_file_k3_step_times_names(tmp_path, monkeypatch, capsys):
    """ci/demo.sh's summary: each finished step (failed ones too) as seconds, outcome, name."""
    times = tmp_path / "times.tsv"
    monkeypatch.setenv(log.STEP_TIMES_ENV, str(times))
    log.register_secret("hunter2-secret")
    with log.step("fetch https://u:hunter2-secret@example.org/x"):
        pass
    with pytest.raises(RuntimeError), log.step("broken\tstep"):
        raise RuntimeError("boom")
    rows = [line.split("\t") for line in times.read_text().splitlines()]
    assert [(r[1], r[2]) for r in rows] == [("done", "fetch https://***@example.org/x"), ("FAILED", "broken\\x09step")]
    assert all(float(r[0]) >= 0 for r in rows)
    monkeypatch.delenv(log.STEP_TIMES_ENV)
    with log.step("not recorded"):
        pass
    assert len(times.read_text().splitlines()) == 2
