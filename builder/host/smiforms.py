"""Two machine forms of nvidia-smi: `nvidia-smi -q -x` (XML) and `--query-gpu ... --format=csv`,
with or without its header.

The XML is untrusted input and is read with expat directly: no DTD is loaded, and a document that
declares an entity (internal or external: "billion laughs", XXE) is refused before anything is
expanded; nvidia-smi itself never declares one (its `--dtd` output declares elements only). Nor does
it nest deeper than a few levels: a document nested deeper than ``MAX_XML_DEPTH`` is refused at the
first element past it, so the work stays linear in the (1 MiB-capped) input.
A CSV without its header (`--format=csv,noheader`) has no column names: they come from
``columns`` (`build doctor --columns`) or from the `nvidia-smi --query-gpu=...` command line the
capture carries (an evidence bundle, a pasted terminal, an exporter's capture); without either,
doctor says which columns it needs.
"""

from __future__ import annotations

import csv
import re
from xml.parsers import expat

from builder.host.hostgpu import HostGPU, SmiParseError, version_tuple

_VER = r"(\d+\.\d+(?:\.\d+)?)"
WINDOWS_MODEL = re.compile(r"\b(WDDM|TCC|MCDM)\b")
NEEDED = "driver_version (or kmd_version), name, compute_cap"
HEADERLESS = (
    "a --query-gpu CSV without its header (`--format=csv,noheader`) has no column names; give them with "
    f"--columns (the list passed to --query-gpu, in its order; doctor reads {NEEDED}), or capture it "
    "with `--format=csv` (header kept), e.g. `nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv`"
)
_QUERY = re.compile(r"--query-gpu[= ][ \t]*+([A-Za-z0-9_.]++(?:[ \t]*+,[ \t]*+[A-Za-z0-9_.]++)*+)")


# --- XML -----------------------------------------------------------------------------------------

# nvidia-smi -q -x nests at most 5 levels (nvidia_smi_log/gpu/mig_devices/mig_device/...); the cap
# leaves room for new sections and refuses a document built to make the reader slow.
MAX_XML_DEPTH = 32
_XML_FIELDS = {
    ("driver_version",): "driver",
    ("kmd_version",): "kmd",
    ("cuda_version",): "cuda",
    ("gpu", "product_name"): "name",
    ("gpu", "product_architecture"): "arch",
    ("gpu", "compute_cap"): "cap",
    ("gpu", "driver_model", "current_dm"): "model",
    ("gpu", "gpu_virtualization_mode", "virtualization_mode"): "virt",
    ("gpu", "mig_devices", "mig_device", "index"): "mig",
}


def _refuse(*_args) -> None:
    raise SmiParseError("the nvidia-smi XML declares an entity; refused (nvidia-smi -q -x never declares one)")


def _refuse_external(*_args) -> int:
    _refuse()
    return 0  # never reached: expat stops on the exception


def _xml_values(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(top-level values, one dict per <gpu>) for the fields doctor reads."""
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.EntityDeclHandler = _refuse
    parser.UnparsedEntityDeclHandler = _refuse
    parser.ExternalEntityRefHandler = _refuse_external
    path: list[str] = []
    buf: list[str] = []
    top: dict[str, str] = {}
    gpus: list[dict[str, str]] = []

    def start(name: str, _attrs: dict) -> None:
        if len(path) >= MAX_XML_DEPTH:
            raise SmiParseError(
                f"the nvidia-smi XML nests deeper than {MAX_XML_DEPTH} levels (nvidia-smi -q -x nests a few); refused"
            )
        path.append(name)
        buf.clear()
        if path == ["nvidia_smi_log", "gpu"]:
            gpus.append({})

    def end(name: str) -> None:
        key = _XML_FIELDS.get(tuple(path[1:]))
        value = " ".join("".join(buf).split())  # one line: a name never carries a line break to print
        if key and len(path) == 2:
            top[key] = value
        elif key and gpus:
            gpus[-1][key] = f"{gpus[-1].get(key, '')} {value}".strip() if key == "mig" else value
        path.pop()
        buf.clear()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = buf.append
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise SmiParseError(
            f"the nvidia-smi XML is cut or malformed ({exc}); capture `nvidia-smi -q -x` again, whole"
        ) from None
    return top, gpus


def parse_xml(text: str) -> HostGPU:
    top, gpus = _xml_values(text)
    version = next((v for v in (top.get("kmd", ""), top.get("driver", "")) if re.fullmatch(_VER, v)), None)
    if version is None:
        raise SmiParseError("the nvidia-smi XML has no <driver_version> (or <kmd_version>)")
    cuda = top.get("cuda", "")
    models = tuple(m for g in gpus if WINDOWS_MODEL.fullmatch(m := g.get("model", "")))
    virt = " ".join(g.get("virt", "") for g in gpus)
    return HostGPU(
        version_tuple(version),
        cuda if re.fullmatch(r"\d+\.\d+", cuda) else None,
        tuple(g.get("name", "") for g in gpus),
        note=f"the driver reports 'CUDA Version: {cuda}'" if cuda and not cuda[0].isdigit() else "",
        platform="windows" if models else "linux",
        form="xml",
        version_text=version,
        mig_devices=sum(len(g.get("mig", "").split()) for g in gpus),
        caps=tuple(g.get("cap") for g in gpus),
        archs=tuple(g.get("arch") for g in gpus),
        driver_models=models,
        vgpu="manager" if cuda == "Not Found" or "Host VGPU" in virt else "guest" if "VGPU" in virt else None,
    )


# --- CSV -----------------------------------------------------------------------------------------


def command_columns(text: str) -> tuple[str, ...] | None:
    """The columns of a `nvidia-smi --query-gpu=a,b,c` command line the capture carries."""
    for line in text.split("\n"):
        m = _QUERY.search(line) if "nvidia-smi" in line else None
        if m:
            return tuple(c.strip() for c in m.group(1).split(",") if c.strip())
    return None


def _column(name: str) -> str:
    """A header cell as a column name: "memory.total [MiB]" -> "memory.total", "gpu_name" -> "name"."""
    bare = re.sub(r"\s*\[.*?\]\s*$", "", name.strip()).lower()
    return {"gpu_name": "name"}.get(bare, bare)


def _data_lines(text: str) -> list[str]:
    """The CSV's lines: blank lines, comments and the command line that produced it left out."""
    return [
        line
        for line in text.split("\n")
        if line.strip() and not line.lstrip().startswith(("#", "$")) and "nvidia-smi" not in line
    ]


def parse_csv(text: str, columns: tuple[str, ...] | None = None) -> HostGPU | None:
    """`--query-gpu=... --format=csv` with its header (``driver_version`` in any column of any
    number: exporters capture ~240), or without it given ``columns`` (or a command line in the
    capture). None when the text is not a CSV at all."""
    lines = _data_lines(text)
    head = next((i for i, line in enumerate(lines) if re.search(r"(^|,)\s*(driver|kmd)_version\s*(,|$)", line)), None)
    if head is not None:
        rows = list(csv.reader(lines[head:], skipinitialspace=True))
        return _host([_column(c) for c in rows[0]], rows[1:], "header")
    columns = columns or command_columns(text)
    if columns and lines and all("," in line or len(columns) == 1 for line in lines):
        return _host([_column(c) for c in columns], list(csv.reader(lines, skipinitialspace=True)), "--columns")
    rows_2 = [m for line in lines if (m := re.fullmatch(r"\s*(\d{3}\.\d+(?:\.\d+)?)\s*,\s*([^,]+?)\s*", line))]
    if lines and len(rows_2) == len(lines):
        first = rows_2[0].group(1)
        if len({r.group(1) for r in rows_2}) > 1:
            raise SmiParseError("the CSV names more than one driver version; capture one host at a time")
        return HostGPU(version_tuple(first), None, tuple(r.group(2) for r in rows_2), form="csv", version_text=first)
    if lines and all(line.count(",") >= 2 for line in lines):
        return HostGPU(None, None, (), form="csv", missing=HEADERLESS)
    return None


def _host(names: list[str], rows: list[list[str]], where: str) -> HostGPU:
    if "driver_version" not in names and "kmd_version" not in names:
        raise SmiParseError(
            f"the CSV's column list ({where}) names no driver_version or kmd_version; doctor reads {NEEDED}"
        )
    table = [dict(zip(names, (v.strip() for v in row), strict=False)) for row in rows if any(v.strip() for v in row)]
    if any(len(row) != len(names) for row in rows if any(v.strip() for v in row)):
        raise SmiParseError(
            f"the CSV's rows do not have the {len(names)} columns of its column list ({where}); give the list "
            "passed to --query-gpu, in its order"
        )
    versions = [v for row in table if (v := _csv_driver(row))]
    if not table or len(versions) != len(table):
        raise SmiParseError("the --query-gpu CSV has a driver_version column but a row without a version")
    if len(set(versions)) > 1:  # two hosts' captures pasted together: never judged as one
        raise SmiParseError(
            f"the --query-gpu CSV names more than one driver version ({', '.join(sorted(set(versions)))}); "
            "capture one host at a time (one nvidia-smi output per file)"
        )
    models = tuple(m for row in table if WINDOWS_MODEL.fullmatch(m := row.get("driver_model.current") or ""))
    virt = " ".join(row.get("virtualization_mode") or "" for row in table)
    return HostGPU(
        version_tuple(versions[0]),
        None,
        tuple(n for row in table if (n := row.get("name") or "")),
        form="csv",
        version_text=versions[0],
        platform="windows" if models else "linux",
        caps=tuple(row.get("compute_cap") for row in table),
        driver_models=models,
        vgpu="manager" if "Host VGPU" in virt else "guest" if "VGPU" in virt else None,
    )


def _csv_driver(row: dict) -> str | None:
    """kmd_version (R610+) when it holds a version, else driver_version."""
    for column in ("kmd_version", "driver_version"):
        value = (row.get(column) or "").strip()
        if re.fullmatch(_VER, value):
            return value
    return None
