"""The image config as the NVIDIA container runtime and the dynamic loader read it (issue 51): pure
rules over the config's Env and the image's files read on the host (imagefiles.py), so no program of
the image answers.

What nvidia-container-toolkit does with the config (internal/config/image/cuda_image.go) and
libnvidia-container evaluates (src/cli/dsl.c), as the checks model it:

- every ``NVIDIA_REQUIRE_*`` variable but ``NVIDIA_REQUIRE_JETPACK*`` is a requirement; none is
  checked when ``NVIDIA_DISABLE_REQUIRE`` parses as true (Go's strconv.ParseBool); an image with
  ``CUDA_VERSION`` and no ``NVIDIA_REQUIRE_CUDA`` (a "legacy" image) requires ``cuda>=MAJOR.MINOR``;
- a requirement is alternatives separated by spaces, each a conjunction of ``name OP value`` terms
  separated by commas; ``cuda`` and ``driver`` compare the host driver's CUDA version and its
  version (numerically, part by part), ``arch`` and ``brand`` the GPU; a term of another name or
  operator is "invalid expression" and the container does not start. The first alternative that
  holds satisfies it; none holding refuses the container ("unsatisfied condition");
- ``NVIDIA_DRIVER_CAPABILITIES`` is a comma-separated list (``all`` is every capability); unset
  or empty it is the default, ``utility,compute`` (capabilities.go ``DefaultDriverCapabilities``);
- ``NVIDIA_VISIBLE_DEVICES`` unset, empty or ``void`` gives no device (a legacy image: all).

Findings are (path, what): a variable of the config is named by its place in the OCI image config,
``/config/Env/NAME``, so ``runtime.waivers`` names it like any path (builder/config/waivers.py).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from builder.checks import imagefiles

ENV = "/config/Env/"  # how a finding names a variable of the config (a waiver's path)
OPERATORS = ("<=", ">=", "!=", "=", "<", ">")  # longest first, as the DSL's strspn reads them
VERSION_TERMS = ("cuda", "driver")
DEVICE_TERMS = ("arch", "brand")
NEEDED_CAPABILITIES = ("compute", "utility")  # libcuda and NVML (nvidia-smi): what vLLM needs
# The capabilities the toolkit supports (internal/config/image/capabilities.go SupportedDriverCapabilities);
# another word in a list without "all" makes its hook panic: "unsupported capabilities found"
# (cmd/nvidia-container-runtime-hook/container_config.go getDriverCapabilities).
KNOWN_CAPABILITIES = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")
_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # Go's strconv.ParseBool
_FALSE = ("0", "f", "F", "FALSE", "false", "False")
UINTMAX_MAX = (1 << 64) - 1  # strtoumax's overflow value, which dsl_compare_version refuses
FAR_DRIVER = ("999.99.99", (99, 9))  # a driver newer than any: a requirement must not refuse it


@dataclass(frozen=True)
class Driver:
    """The host driver a requirement is judged against: its version and the CUDA it reports."""

    version: str
    cuda: tuple[int, ...]


def _numbers(text: str) -> tuple[int, ...] | None:
    """A version as dsl_compare_version reads it: digits and dots, a number first (strtoumax reads
    none at a '.'), no number at UINTMAX_MAX or past it; None where it returns -1 (invalid)."""
    if not re.fullmatch(r"[0-9][0-9.]*", text):
        return None
    numbers = tuple(int(p) for p in text.split(".") if p)
    return None if any(n >= UINTMAX_MAX for n in numbers) else numbers


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    width = max(len(have), len(want))
    a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _term(text: str) -> tuple[str, str, str] | None:
    """(name, operator, value) of one ``name OP value`` term, None when the DSL rejects it."""
    # strcspn to the first operator character, strspn over all of them, the rest the value: no
    # backtracking into the operator ('brand==' is the operator '==', no value, not '=' and '=').
    m = re.fullmatch(r"([^<>=!]+)([<>=!]+)(.*)", text, re.S)
    if not m or m.group(2) not in OPERATORS or not m.group(3):
        return None
    name = m.group(1).lower()
    if name not in VERSION_TERMS + DEVICE_TERMS:
        return None
    if name in VERSION_TERMS and _numbers(m.group(3)) is None:
        return None
    if name == "brand" and m.group(2) not in ("=", "!="):
        return None
    return name, m.group(2), m.group(3)


def requirement(text: str, driver: Driver) -> tuple[bool | None, str]:
    """Whether ``driver`` satisfies the requirement ``text`` on every GPU (True), on none (False),
    or only on some (None: every alternative that holds also names an arch or brand); and why.
    Terms are read in order, as dsl_evaluate does: a false one ends its alternative unread further,
    an invalid one that is reached refuses the container."""
    some: list[str] = []
    for number, alt in enumerate(a for a in text.split(" ") if a):
        if not [t for t in alt.split(",") if t]:
            # no term: dsl_evaluate leaves the loop with ret as it was: its initial true when first,
            # else the false of the alternatives before (on the GPUs where none of them held)
            if number == 0:
                return True, f"{alt!r} has no term and is first: it holds"
            break
        holds, device = _alternative(alt, driver)
        if holds is None:
            return False, device
        if holds and not device:
            return True, f"{alt!r} holds"
        if holds:
            some.append(alt)
    if some:
        return None, f"only {', '.join(repr(s) for s in some)} hold(s): on those GPUs alone"
    if not text.strip():
        return True, "an empty requirement holds"
    return False, "no alternative holds (unsatisfied condition)"


def _alternative(alt: str, driver: Driver) -> tuple[bool | None, str]:
    """(does every term hold, "" or the device terms it also needs); (None, why) for an invalid term."""
    device = []
    for text in [t for t in alt.split(",") if t]:
        term = _term(text)
        if term is None:
            return None, f"{text!r} is not an expression libnvidia-container evaluates (invalid expression)"
        name, op, value = term
        if name in DEVICE_TERMS:
            device.append(text)
        elif not _compare(driver.cuda if name == "cuda" else _numbers(driver.version) or (), op, _numbers(value) or ()):
            return False, ""
    return True, ",".join(device)


def requirements(env: dict[str, str]) -> dict[str, str]:
    """The requirements the toolkit hands libnvidia-container: variable -> value."""
    if env.get("NVIDIA_DISABLE_REQUIRE", "") in _TRUE:
        return {}
    found = {
        k: v for k, v in env.items() if k.startswith("NVIDIA_REQUIRE_") and not k.startswith("NVIDIA_REQUIRE_JETPACK")
    }
    if env.get("CUDA_VERSION") and not env.get("NVIDIA_REQUIRE_CUDA"):
        m = _SEMVER.fullmatch(env["CUDA_VERSION"])
        found["CUDA_VERSION"] = f"cuda>={int(m[1])}.{int(m[2] or 0)}" if m else "(an invalid CUDA_VERSION)"
    return found


# What Masterminds semver's NewVersion (the toolkit's parseMajorMinorVersion) reads: minor and patch
# optional (0), a -prerelease and +metadata after them; anything else is an error (the hook fails).
_SEMVER = re.compile(r"v?([0-9]+)(?:\.([0-9]+))?(?:\.[0-9]+)?(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")


def requirement_findings(env: dict[str, str], floor: Driver) -> list[tuple[str, str]]:
    """Each requirement the floor driver (or a newer one) does not satisfy on every GPU."""
    found = []
    far = Driver(FAR_DRIVER[0], FAR_DRIVER[1])
    for var, text in sorted(requirements(env).items()):
        shown = f"{var}={text!r}" + (
            " (legacy: CUDA_VERSION set, NVIDIA_REQUIRE_CUDA unset)" if var == "CUDA_VERSION" else ""
        )
        ok, why = requirement(text, floor)
        if ok is not True:
            what = "refuses" if ok is False else "accepts only some GPUs with"
            found.append(
                (ENV + var, f"{shown} {what} the driver floor {floor.version} (CUDA {_dot(floor.cuda)}): {why}")
            )
            continue
        ok, why = requirement(text, far)
        if ok is not True:
            found.append((ENV + var, f"{shown} refuses drivers newer than the floor: {why}"))
    disable = env.get("NVIDIA_DISABLE_REQUIRE")
    if disable is not None and disable not in _TRUE + _FALSE:
        found.append((ENV + "NVIDIA_DISABLE_REQUIRE", f"{disable!r} is not a boolean the toolkit parses (ignored)"))
    return found


def _dot(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def capability_findings(env: dict[str, str]) -> list[tuple[str, str]]:
    """NVIDIA_DRIVER_CAPABILITIES must grant compute and utility (or all). Unset or empty, the
    toolkit grants its default, utility,compute (a legacy image: every supported one)."""
    raw = env.get("NVIDIA_DRIVER_CAPABILITIES", "")
    caps = {c.strip() for c in raw.split(",") if c.strip()}
    if not raw or "all" in caps:
        return []
    unknown = sorted(caps - set(KNOWN_CAPABILITIES))
    if unknown:
        why = f"{raw!r}: {', '.join(unknown)} is no capability the toolkit supports (its hook refuses the container)"
        return [(ENV + "NVIDIA_DRIVER_CAPABILITIES", why)]
    missing = [c for c in NEEDED_CAPABILITIES if c not in caps]
    if missing:
        return [(ENV + "NVIDIA_DRIVER_CAPABILITIES", f"{raw!r} grants no {' or '.join(missing)}")]
    return []


def visible_devices_findings(env: dict[str, str]) -> list[tuple[str, str]]:
    """NVIDIA_VISIBLE_DEVICES, where the config sets it, must not hide every GPU or name a malformed device."""
    raw = env.get("NVIDIA_VISIBLE_DEVICES")
    if raw is None:
        return []  # the operator's --gpus / the CDI request decides
    devices = [d.strip() for d in raw.split(",") if d.strip()]
    if not devices or "void" in devices or devices == ["none"]:
        return [(ENV + "NVIDIA_VISIBLE_DEVICES", f"{raw!r} gives the container no GPU")]
    plain = re.compile(r"all|[0-9]+(?::[0-9]+)?|(?:GPU|MIG)-[A-Za-z0-9/-]+")
    odd = [d for d in devices if not (plain.fullmatch(d) or _CDI.fullmatch(d))]
    if odd:
        return [(ENV + "NVIDIA_VISIBLE_DEVICES", f"{raw!r}: {', '.join(odd)} is no index, UUID, CDI name or 'all'")]
    return []


# A CDI device name (vendor/class=name, tags.cncf.io/container-device-interface parser.IsQualifiedName),
# which the toolkit takes in NVIDIA_VISIBLE_DEVICES (cuda_image.go OnlyFullyQualifiedCDIDevices).
_CDI = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*=[A-Za-z0-9][A-Za-z0-9_.:-]*")


def library_path_findings(
    env: dict[str, str], files: imagefiles.ImageFiles, cuda_major_minor: str, compat_dir: str
) -> list[tuple[str, str]]:
    """LD_LIBRARY_PATH never puts the compat directory or another CUDA's libraries first: an entry
    that is a CUDA compat directory (the matrix's cuda.compat_dir, or one named .../compat), or
    holds a libcudart of another CUDA major, or is another CUDA's versioned tree."""
    found = []
    compat = files.resolve(compat_dir)
    for entry in [e for e in env.get("LD_LIBRARY_PATH", "").split(":") if e]:
        norm = posixpath.normpath(entry)
        here = files.resolve(norm)
        same = compat is not None and here is not None and here.path == compat.path
        if norm == posixpath.normpath(compat_dir) or same or norm.endswith("/compat") or "/compat/" in norm:
            found.append(
                (entry, "LD_LIBRARY_PATH names a CUDA compat directory: its libcuda wins over the host driver's")
            )
            continue
        other = _other_cuda(norm, files, cuda_major_minor)
        if other:
            found.append((entry, f"LD_LIBRARY_PATH names another CUDA's libraries: {other}"))
    return found


def _other_cuda(directory: str, files: imagefiles.ImageFiles, want: str) -> str | None:
    """Why ``directory`` holds another CUDA than ``want``: a versioned CUDA tree (cuda-13.0) or a
    libcudart.so.N of another major, read on the host."""
    resolved = files.resolve(directory)
    real = resolved.path if resolved is not None else directory
    m = re.search(r"/cuda-(\d+\.\d+)(?:/|$)", directory) or re.search(r"/cuda-(\d+\.\d+)(?:/|$)", real)
    if m and m.group(1) != want:
        return f"{directory} is CUDA {m.group(1)}'s tree, not {want}'s"
    if resolved is None or resolved.kind != "dir":
        return None
    major = want.split(".")[0]
    top = real.rstrip("/") + "/"
    for path, entry in files.entries.items():
        if path.startswith(top) and "/" not in path[len(top) :]:
            lib = re.fullmatch(r"libcudart\.so\.(\d+)(?:\.\d+)*", path[len(top) :])
            if lib and lib.group(1) != major and entry.kind in ("file", "link"):
                return f"{path} (CUDA {lib.group(1)})"
    return None


# --- interpreter options set in the environment ----------------------------------------------------
# Each changes what the image's Python runs or how (docs.python.org/3/using/cmdline.html#environment-variables).
# Shown always; failed where it changes what runs, unless runtime.waivers.interpreter_options names it.
RUNS_CODE = {
    "PYTHONSTARTUP": "a file Python runs before an interactive prompt",
    "PYTHONINSPECT": "Python enters interactive mode after the script (a server never exits cleanly)",
    "PYTHONHOME": "Python's standard library is read from another prefix",
    "PYTHONUSERBASE": "another user site directory (its .pth files run at start-up)",
    "PYTHONEXECUTABLE": "another sys.executable (macOS only; shown)",
    "PYTHONPLATLIBDIR": "another platform library directory",
    "PYTHONSAFEPATH": "",
    "LD_PRELOAD": "libraries the dynamic loader loads into every process before its own",
    "LD_AUDIT": "auditing libraries the dynamic loader runs in every process",
    "PYTHONBREAKPOINT": "what breakpoint() calls",
}
CHANGES_HOW = {
    "PYTHONWARNINGS": "warnings made errors stop code that only warns",
    "PYTHONNOUSERSITE": "",
    "PYTHONOPTIMIZE": "assert statements and __debug__ blocks are removed",
    "PYTHONDEVMODE": "development mode: extra checks and warnings",
    "PYTHONMALLOC": "another memory allocator",
    "PYTHONHASHSEED": "",
    "PYTHONDONTWRITEBYTECODE": "",
    "PYTHONUNBUFFERED": "",
    "PYTHONIOENCODING": "",
    "PYTHONUTF8": "",
    "PYTHONFAULTHANDLER": "",
    "PYTHONNODEBUGRANGES": "",
}


def _unset(var: str, value: str) -> bool:
    """Whether CPython (and ld.so) read ``var=value`` as unset: an empty value always (_Py_GetEnv);
    PYTHONOPTIMIZE is an integer flag (_Py_get_env_flag: 0 is off, a negative or non-integer value 1)."""
    if not value:
        return True
    return var == "PYTHONOPTIMIZE" and value.strip().isdigit() and int(value) == 0


def interpreter_findings(env: dict[str, str], files: imagefiles.ImageFiles) -> tuple[list[tuple[str, str]], list[str]]:
    """(findings that fail unless waived, lines only shown) for the interpreter options of the config
    and a non-empty /etc/ld.so.preload in the image's files."""
    failed, shown = [], []
    for var, value in sorted(env.items()):
        if (var in RUNS_CODE or var in CHANGES_HOW) and _unset(var, value):
            shown.append(f"{var}={value!r}: read as unset")
        elif var in RUNS_CODE and RUNS_CODE[var]:
            failed.append((ENV + var, f"{var}={value!r}: {RUNS_CODE[var]}"))
        elif var == "PYTHONWARNINGS" and any(part.split(":")[0].strip() == "error" for part in value.split(",")):
            failed.append((ENV + var, f"{var}={value!r}: {CHANGES_HOW[var]}"))
        elif var in CHANGES_HOW and CHANGES_HOW[var] and var != "PYTHONWARNINGS":
            failed.append((ENV + var, f"{var}={value!r}: {CHANGES_HOW[var]}"))
        elif var == "PYTHONPATH":
            shown.append(f"{var}={value!r}: judged by loaded_libraries (an entry missing or shadowing fails there)")
        elif var.startswith("PYTHON") or var in RUNS_CODE or var in CHANGES_HOW:
            shown.append(f"{var}={value!r}")
    if "PYTHONNOUSERSITE" not in env:
        shown.append(
            "PYTHONNOUSERSITE unset: the runtime user's site directory, if it exists, is on sys.path "
            "(startup_hooks reads its .pth files)"
        )
    preload = files.texts.get("/etc/ld.so.preload", b"")
    lines = [
        ln.strip()
        for ln in preload.decode("utf-8", "replace").splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    if lines:
        failed.append(("/etc/ld.so.preload", f"names {', '.join(lines[:5])}: loaded into every process of the image"))
    return failed, shown
