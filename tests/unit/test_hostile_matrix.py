"""Hostile matrices, generated: every malformed or adversarial input ends in exit 2 with one line
naming the file and the key, no traceback and no file written, and nothing reaches a rendered
Dockerfile unless it passed validation."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from builder import cli
from builder.config import matrix
from tests.conftest import REPO

BASE = yaml.safe_load((REPO / "matrix.yaml").read_text())
INSTRUCTION = re.compile(r"^(FROM|ARG|ENV|RUN|COPY|USER|ENTRYPOINT|LABEL)\b")
# A fixed seed (derandomize) and no example database: every run tries the same inputs, so a run
# that passes today and fails tomorrow means the code changed, not the dice.
# The mutation run (tests/unit/mutation.py) asks for fewer examples and no shrinking: it runs these
# once per mutant, and only needs to know that one fails.
MUTATION_RUN = "K3_HYPOTHESIS_EXAMPLES" in os.environ
SETTINGS = settings(
    max_examples=int(os.environ.get("K3_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate] if MUTATION_RUN else list(Phase),
)


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    else:
        yield path


def _mappings(node, path=()):
    if isinstance(node, dict):
        yield path
        for k, v in node.items():
            yield from _mappings(v, path + (k,))


LEAVES = sorted(_leaves(BASE), key=str)
# Schema mappings only: these are mappings of user data (names to names, reasons or values).
USER_DATA = {"rewrites", "waive", "absent", "other_major", "overrides", "env", "third_party"}
MAPPINGS = sorted((m for m in _mappings(BASE) if not (m[-1:] and m[-1] in USER_DATA)), key=str)
NASTY = [
    "\n",
    "\r",
    '"',
    "'",
    "$(id)",
    "`id`",
    "{{ 7 * 7 }}",
    "{% raw %}",
    "\\",
    " ",
    "\u2028",
    "\x00",
    "\nRUN curl http://evil | sh",
    "${HOME}",
    "; rm -rf /",
    "é",
    "😀",
]

# Characters no pattern in builder/config/patterns.py accepts anywhere: each breaks a line, quotes, expands or
# escapes in a Dockerfile or a shell. A value holding one is refused at every leaf, whatever its key.
FORBIDDEN = ["\n", "\r", '"', "`", "$", "\\", "\x00", "\u2028", "{", "}"]
NASTY = [
    "\n",
    "\r",
    '"',
    "$(id)",
    "`id`",
    "{{ 7 * 7 }}",
    "{% raw %}",
    "\\",
    "\u2028",
    "\x00",
    "\nRUN curl http://evil | sh",
    "${HOME}",
    '"; rm -rf /',
]
assert all(any(c in n for c in FORBIDDEN) for n in NASTY)

hostile_strings = st.one_of(
    st.sampled_from(NASTY),
    st.builds(lambda a, n, b: a + n + b, st.text(max_size=20), st.sampled_from(NASTY), st.text(max_size=20)),
    st.builds(lambda a, c: a + c, st.text(max_size=50), st.sampled_from(FORBIDDEN)),
)
# Never the type a leaf has: every leaf of the committed matrix is a string, a date, an integer or a
# boolean, and strict types take no other (None is left out: optional keys accept it; empty
# containers too; booleans and floats are not tried on a boolean key).
wrong_types = st.one_of(
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.integers(), min_size=1, max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), min_size=1, max_size=2),
)


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _set(doc, path, value):
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _copy(doc):
    """A copy to change: BASE is plain YAML data (mappings, lists, scalars; no alias: matrix.yaml
    refuses them), so a deep copy is what a dump and reload gave, at a hundredth of the CPU."""
    return copy.deepcopy(doc)


def _baseline_instructions() -> list[str]:
    text = (REPO / "dockerfiles" / "cu129" / "Dockerfile").read_text()
    return [INSTRUCTION.match(line).group(1) for line in text.splitlines() if INSTRUCTION.match(line)]


BASELINE = _baseline_instructions()


_ROOT: list[Path] = []  # the module's own directory (pytest's tmp_path_factory), set by _own_root


@pytest.fixture(scope="module", autouse=True)
def _own_root(tmp_path_factory):
    """Each case's matrix and renders go under this module's pytest directory, not /tmp itself:
    hypothesis runs hundreds of cases, and function-scoped tmp_path does not reach them."""
    _ROOT[:] = [tmp_path_factory.mktemp("hostile")]
    yield
    shutil.rmtree(_ROOT.pop(), ignore_errors=True)


def _run(text: str) -> tuple[int, str, Path]:
    tmp = Path(tempfile.mkdtemp(prefix="k3-hostile-", dir=_ROOT[0]))
    matrix = tmp / "matrix.yaml"
    matrix.write_text(text, encoding="utf-8", errors="surrogatepass")
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            cli.main(["--matrix", str(matrix), "render"])
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue(), tmp


def _assert_refused_cleanly(code: int, stderr: str, tmp: Path) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2, stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {tmp / 'matrix.yaml'}: "), lines[0]
    assert "Traceback" not in stderr
    assert sorted(p.name for p in tmp.iterdir()) == ["matrix.yaml"]  # nothing written


def _assert_rendered_safely(tmp: Path, value) -> None:
    dockerfile = (tmp / "dockerfiles" / "cu129" / "Dockerfile").read_text()
    lines = dockerfile.splitlines()
    found = [INSTRUCTION.match(line).group(1) for line in lines if INSTRUCTION.match(line)]
    assert found == BASELINE  # no new instruction, none lost
    for prev, line in zip([""] + lines, lines, strict=False):
        # every line is an instruction, a comment, blank, or the continuation of a '\'-ended line
        assert INSTRUCTION.match(line) or line.startswith("#") or not line.strip() or prev.endswith("\\"), line
    if isinstance(value, str) and value and value in dockerfile:
        assert not set(value) & set('\n\r"`$\\'), repr(value)


def _leaf_key(path) -> str:
    """How the error names a leaf: targets.cu129.cuda.arch_list.0, or defaults.owner (used by ...).
    A list item is named at least by its list (see the union case below)."""
    if isinstance(path[-1], int):
        path = path[:-1]
    return ".".join(matrix._key(p) for p in path)


@SETTINGS
@given(path=st.sampled_from(LEAVES), value=hostile_strings)
def test_any_leaf_replaced_by_a_hostile_string_is_refused_naming_it(path, value):
    doc = _copy(BASE)
    _set(doc, path, value)
    code, stderr, tmp = _run(yaml.safe_dump(doc, allow_unicode=True))
    _assert_refused_cleanly(code, stderr, tmp)
    assert _leaf_key(path) in stderr, (path, stderr)


@SETTINGS
@given(path=st.sampled_from(LEAVES), value=wrong_types)
def test_any_leaf_replaced_by_a_value_of_the_wrong_type_is_refused_naming_it(path, value):
    # A boolean key takes 0/1 and true/false spelled many ways: only containers are wrong for it.
    assume(not (isinstance(_get(BASE, path), bool) and isinstance(value, (bool, float))))
    doc = _copy(BASE)
    _set(doc, path, value)
    code, stderr, tmp = _run(yaml.safe_dump(doc, allow_unicode=True))
    _assert_refused_cleanly(code, stderr, tmp)
    assert _leaf_key(path) in stderr, (path, stderr)


def test_a_bad_submodule_path_is_named_by_its_index():
    doc = _copy(BASE)
    _set(doc, ("targets", "cu129", "source", "third_party", "deepgemm", "submodules", 0), "a\nb")
    code, stderr, tmp = _run(yaml.safe_dump(doc))
    _assert_refused_cleanly(code, stderr, tmp)
    assert "targets.cu129.source.third_party.deepgemm.submodules.0: must be a relative path" in stderr


def test_every_leaf_is_a_string_a_date_an_integer_or_a_boolean():
    # What wrong_types relies on: a leaf of another kind would make "wrong type" ambiguous.
    for path in LEAVES:
        assert isinstance(_get(BASE, path), (str, int, bool, __import__("datetime").date)), path


@pytest.mark.parametrize(
    "path,value",
    [
        (("targets", "cu129", "description"), "K3 (r575): a.b/c_d+e=f@g#h, 1;2-3"),  # every character Text allows
        (
            ("targets", "cu129", "source", "extensions", "absent", "torch.ops._C.fused_kda_decode"),
            "a reason with 'quotes', <angle> [brackets] and (parens)",
        ),  # Reason allows more: it is never rendered
    ],
)
def test_a_valid_unusual_value_renders_without_a_new_instruction(path, value):
    doc = _copy(BASE)
    _set(doc, path, value)
    code, stderr, tmp = _run(yaml.safe_dump(doc, allow_unicode=True))
    assert code == 0, stderr
    _assert_rendered_safely(tmp, value)


@SETTINGS
@given(
    path=st.sampled_from(MAPPINGS), key=st.text(min_size=1, max_size=30), value=st.one_of(hostile_strings, wrong_types)
)
def test_unknown_keys_are_refused(path, key, value):
    doc = _copy(BASE)
    node = doc
    for p in path:
        node = node[p]
    if key in node or (path == ("targets",)):
        return  # an existing key, or a new target (a valid-shaped name is a legitimate new entry)
    node[key] = value
    code, stderr, tmp = _run(yaml.safe_dump(doc, allow_unicode=True))
    _assert_refused_cleanly(code, stderr, tmp)


@SETTINGS
@given(line_no=st.integers(min_value=0, max_value=200))
def test_duplicated_lines_are_duplicate_key_errors(line_no):
    lines = (REPO / "matrix.yaml").read_text().splitlines(keepends=True)
    candidates = [
        i for i, ln in enumerate(lines) if re.match(r"^\s*[a-z_]+: \S", ln) and not ln.lstrip().startswith("#")
    ]
    i = candidates[line_no % len(candidates)]
    code, stderr, tmp = _run("".join(lines[: i + 1] + [lines[i]] + lines[i + 1 :]))
    _assert_refused_cleanly(code, stderr, tmp)
    assert "duplicate key" in stderr


def test_alias_bomb_and_deep_nesting_and_binary():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=False)
    )
    for text in (
        bomb,
        "[" * 50000 + "]" * 50000,
        "version: 1\ntargets: {}\n",
        "\x00\x01\x02",
        "version: 1\n" * 3,
        "!!python/object/apply:os.system ['id']\n",
        "x" * (2 << 20),
    ):
        code, stderr, tmp = _run(text)
        _assert_refused_cleanly(code, stderr, tmp)
