"""A target's platforms (builder/config/platforms.py): the committed cu129 entry names linux/amd64
and linux/arm64, each platform is validated like the rest of the matrix (one line naming the file
and the key, exit 2), each platform's view has its own bases, CPython, arch list and OS loads,
and what one platform pins is no input of another's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.config import matrix
from builder.dockerfile import render
from builder.errors import ConfigError
from builder.pipeline.plan import Plan
from tests.conftest import REPO

SRC = (REPO / "matrix.yaml").read_text()
PATH = REPO / "matrix.yaml"
INDEX = "sha256:bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8"
AMD64 = "sha256:38804006c937a83f28f63a959abcee688042072319c8614ad57b350958a30bd3"
ARM64_PY = "2d8e17dfd732102cfeb18e0e1fa6769b24caa034e159981129590fe409c7157a"


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        matrix.parse(text, Path("matrix.yaml"))
    message = info.value.message
    assert "\n" not in message and message.startswith("matrix.yaml: targets.cu129.")
    assert info.value.exit_code == 2
    return message


def _cu129():
    return matrix.parse(SRC, PATH).target("cu129")


def test_cu129_names_both_platforms_each_with_its_own_pins():
    t = _cu129()
    assert t.platform_names() == ("linux/amd64", "linux/arm64")
    amd, arm = t.for_platform("linux/amd64"), t.for_platform("linux/arm64")
    assert amd.bases.runtime.digest == AMD64 and amd.python.arch == "x86_64"
    assert amd.python.uv_platform() == "x86_64-manylinux_2_35"
    # The arm64 manifest digest is not known here: pinned through the index, said so in the plan.
    assert arm.bases.runtime.digest == INDEX and arm.bases.runtime.display_name == amd.bases.runtime.display_name
    assert arm.python.uv_platform() == "aarch64-manylinux_2_35"
    assert arm.python.wheel_platforms()[0] == "manylinux_2_35_aarch64"
    assert arm.python.standalone.sha256 == ARM64_PY and "aarch64-unknown-linux-gnu" in arm.python.standalone.url
    # Upstream's CUDA_ARCH_AARCH64_CU129 plus 10.3 (GB300); amd64 keeps its own list.
    assert arm.cuda.arch_list == ("8.0", "8.7", "8.9", "9.0", "10.0", "10.3", "12.0")
    assert "7.5" in amd.cuda.arch_list and "8.7" not in amd.cuda.arch_list
    assert arm.os_packages.archive.startswith("https://snapshot.ubuntu.com/ubuntu-ports/")
    assert "/usr/lib/aarch64-linux-gnu/libibverbs/*.so" in arm.os_packages.loads
    assert not any("x86_64" in load for load in arm.os_packages.loads)
    assert t.for_platform("linux/arm64").platform_names() == ("linux/arm64",)


def test_an_arm64_only_change_leaves_the_amd64_input_unchanged():
    before = _cu129()
    changed = SRC.replace(
        '        arch_list: ["8.0", "8.7", "8.9", "9.0", "10.0", "10.3", "12.0"]\n',
        '        arch_list: ["8.0", "8.9", "9.0", "10.0", "10.3", "12.0"]\n',
        1,
    )
    assert changed != SRC
    after = matrix.parse(changed, PATH).target("cu129")
    amd = "linux/amd64"
    assert before.for_platform(amd).as_input() == after.for_platform(amd).as_input()
    assert before.for_platform("linux/arm64").as_input() != after.for_platform("linux/arm64").as_input()
    # ... and the amd64 Dockerfile is byte for byte what it was; the arm64 one moved.
    assert render.render(before.for_platform(amd)) == render.render(after.for_platform(amd))
    assert render.render(before.for_platform("linux/arm64")) != render.render(after.for_platform("linux/arm64"))


def test_a_one_platform_target_keeps_its_input_and_files():
    t = _cu129().model_copy(update={"platforms": {}})
    assert t.platform_names() == ("linux/amd64",)
    assert "platforms" not in t.as_input()  # input keys of existing one-platform records hold
    assert t.for_platform("linux/amd64") is t


def test_each_platform_has_its_own_files_and_the_plan_shows_both():
    m = matrix.parse(SRC, PATH)
    plan = Plan.of(m, "cu129")
    amd, arm = plan.platform_plans()
    assert amd.dockerfile == plan.dockerfile and amd.lock_paths == plan.lock_paths
    assert arm.dockerfile == REPO / "dockerfiles/cu129/linux-arm64/Dockerfile"
    assert arm.lock_paths.runtime == REPO / "locks/cu129/linux-arm64/requirements.txt"
    assert arm.lock_paths.os == REPO / "locks/cu129/linux-arm64/os-packages.txt"
    rows = dict(plan.rows())
    assert rows["platforms"].startswith("linux/amd64, linux/arm64")
    assert "manifest resolved per build, unconfirmed" in rows["linux/arm64 runtime base"]
    assert rows["linux/amd64 runtime base"].endswith(f"index {INDEX}")
    assert rows["linux/arm64 arch"] == "8.0 8.7 8.9 9.0 10.0 10.3 12.0"
    doc = json.loads(json.dumps(plan.to_json()))
    assert doc["platforms"]["linux/arm64"]["python"]["platform"] == "aarch64-manylinux_2_35"
    with pytest.raises(ConfigError, match="linux/s390x is not one of its platforms"):
        Plan.of(m, "cu129", "linux/s390x")


def test_the_committed_arm64_dockerfile_is_what_the_matrix_renders():
    arm = Plan.of(matrix.parse(SRC, PATH), "cu129", "linux/arm64")
    assert render.drift(arm.target, arm.dockerfile) is None
    text = arm.dockerfile.read_text()
    assert "# Platform linux/arm64:" in text and 'TORCH_CUDA_ARCH_LIST="8.0 8.7 8.9' in text


ARM = "      linux/arm64:\n"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "      linux/arm64:\n",
            "      linux/s390x:\n",
            "platforms.'linux/s390x': must be one of linux/amd64, linux/arm64",
        ),
        (
            "    platforms:\n      linux/amd64:\n",
            "    platforms:\n      linux/amd64:\n        arch_list: ['9.0']\n",
            "platforms.'linux/amd64'.bases: the first platform's bases, python and arch_list are the target's own",
        ),
        (
            "        bases:\n          build: nvidia/cuda:12.9.1-devel-ubuntu22.04@sha256:bd4e",
            "        xbases:\n          build: nvidia/cuda:12.9.1-devel-ubuntu22.04@sha256:bd4e",
            "platforms.'linux/arm64'.xbases",
        ),
        (
            "          build: nvidia/cuda:12.9.1-devel-ubuntu22.04@sha256:bd4e",
            "          build: nvidia/cuda:12.8.1-devel-ubuntu22.04@sha256:bd4e",
            "platforms.'linux/arm64'.bases.build: nvidia/cuda:12.8.1-devel-ubuntu22.04 is not the target's "
            "nvidia/cuda:12.9.1-devel-ubuntu22.04: one tag, one manifest per platform",
        ),
        (
            "          runtime: nvidia/cuda:12.9.1-devel-ubuntu22.04@sha256:bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8\n        index:",
            f"          runtime: nvidia/cuda:12.9.1-devel-ubuntu22.04@{AMD64}\n        index:",
            "platforms.'linux/arm64'.bases.runtime: sha256:38804006c937... is already linux/amd64's manifest",
        ),
        (
            "          runtime: nvidia/cuda:12.9.1-devel-ubuntu22.04@sha256:bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8\n        index:",
            "          runtime: nvidia/cuda:12.9.1-devel-ubuntu22.04\n        index:",
            "platforms.'linux/arm64'.bases.runtime: must be pinned by digest",
        ),
        (
            "          runtime: sha256:bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8\n        # python-build",
            "          runtime: sha256:" + "0" * 64 + "\n        # python-build",
            "platforms.'linux/arm64'.index.runtime: the same tag has one index digest on every platform",
        ),
        (
            "          build: sha256:bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8\n          runtime: sha256:bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8\n      linux/arm64",
            "          build: bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8\n          runtime: sha256:bd4e2680a261c212f1e2fea241606f71497dc67a417f73175d794ec8212b5ba8\n      linux/arm64",
            "platforms.'linux/amd64'.index.build: must be a digest sha256:<64 lowercase hex>",
        ),
        (
            "20260814-aarch64-unknown-linux-gnu-install_only_stripped",
            "20260814-x86_64-unknown-linux-gnu-install_only_stripped",
            "platforms.'linux/arm64'.python.url: must be a aarch64 build (aarch64-unknown-linux-gnu)",
        ),
        (
            "          sha256: 2d8e17dfd732102cfeb18e0e1fa6769b24caa034e159981129590fe409c7157a\n",
            "",
            "platforms.'linux/arm64'.python.sha256",
        ),
        (
            "        archive: https://snapshot.ubuntu.com/ubuntu-ports/20261101T000000Z\n",
            "",
            "platforms.'linux/arm64'.archive: required: Ubuntu serves this machine from ubuntu-ports",
        ),
        (
            "          - /usr/lib/aarch64-linux-gnu/libibverbs/*.so\n",
            "          - /usr/lib/x86_64-linux-gnu/libibverbs/*.so\n",
            "platforms.'linux/arm64'.loads: names another machine's library directory (this platform is aarch64)",
        ),
        (
            '        arch_list: ["8.0", "8.7", "8.9", "9.0", "10.0", "10.3", "12.0"]\n',
            "        arch_list: []\n",
            "platforms.'linux/arm64'.arch_list",
        ),
    ],
)
def test_bad_platform_entries_are_one_line_naming_the_key(old, new, expected):
    assert old in SRC, old
    assert expected in _error(SRC.replace(old, new, 1))


def test_a_second_platform_states_its_own_bases_python_and_loads():
    start = SRC.index("      linux/arm64:\n")
    end = SRC.index("        # python-build-standalone 3.12.14 (20260814), aarch64")
    no_bases = SRC[:start] + "      linux/arm64:\n" + SRC[end:]
    assert "platforms.'linux/arm64'.bases: required" in _error(no_bases)
    py_start = SRC.index("        # python-build-standalone 3.12.14 (20260814), aarch64")
    py_end = SRC.index("        # vLLM's release list for CUDA 12.9 aarch64")
    assert "platforms.'linux/arm64'.python: required" in _error(SRC[:py_start] + SRC[py_end:])
    loads = SRC.index("        loads:\n          - libibverbs.so.1\n          - /usr/lib/aarch64")
    loads_end = SRC.index("          - libnuma.so.1\n", loads) + len("          - libnuma.so.1\n")
    assert "platforms.'linux/arm64'.loads: required: os_packages.loads names x86_64-linux-gnu" in _error(
        SRC[:loads] + SRC[loads_end:]
    )


def test_the_first_platform_must_be_the_targets_own_machine():
    text = SRC.replace("    platforms:\n      linux/amd64:\n", "    platforms:\n      linux/arm64x:\n", 1)
    assert "must be one of" in _error(text)
    swapped = SRC.replace("      provider: standalone\n", "      provider: standalone\n      arch: aarch64\n", 1)
    assert "platforms.'linux/amd64': the first platform is the target's own, so python.arch must be x86_64" in _error(
        swapped
    )


def _index_server(platform_labels: dict[str, str]):
    """A loopback registry serving k3/x:t as an index of one image per architecture."""
    import hashlib
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    blobs, manifests, entries = {}, {}, []
    for arch, floor in platform_labels.items():
        config = json.dumps({"architecture": arch, "os": "linux", "config": {"Labels": {"floor": floor}}}).encode()
        blobs[digest(config)] = config
        cfg = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)}
        manifest = json.dumps(
            {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": cfg, "layers": []}
        ).encode()
        manifests[digest(manifest)] = (manifest, "application/vnd.oci.image.manifest.v1+json")
        entries.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest(manifest),
                "size": len(manifest),
                "platform": {"architecture": arch, "os": "linux"},
            }
        )
    index = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}
    ).encode()
    manifests["t"] = (index, "application/vnd.oci.image.index.v1+json")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, head: bool):
            ref = self.path.rsplit("/", 1)[1]
            data, ctype = manifests.get(ref) or (blobs.get(ref), "application/octet-stream")
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Docker-Content-Digest", digest(data))
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._reply(False)

        def do_HEAD(self):  # noqa: N802
            self._reply(True)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"127.0.0.1:{httpd.server_address[1]}"


def test_doctor_reads_the_hosts_platform_of_an_index():
    """The labels doctor judges by are the host's platform's (an arm64 host: the arm64 image's)."""
    from builder.engine.registry import RegistryClient

    httpd, host = _index_server({"amd64": "amd-floor", "arm64": "arm-floor"})
    try:
        client = RegistryClient()
        ref = f"{host}/k3/x:t"
        assert client.image_config(ref, "arm64")["config"]["Labels"]["floor"] == "arm-floor"
        assert client.image_config(ref)["config"]["Labels"]["floor"] == "amd-floor"  # the default
        assert client.image_config(ref, "s390x") is None  # not offered: nothing is made up
    finally:
        httpd.shutdown()


def test_the_whole_targets_input_is_its_first_platforms():
    """The input key, the provenance's externalParameters and verify all read ``as_input``: of a
    target naming several platforms it is the first platform's, so an arm64-only change keeps
    the amd64 record (and its provenance) current."""
    t = _cu129()
    assert t.as_input() == t.for_platform("linux/amd64").as_input()
    assert list(t.as_input()["platforms"]) == ["linux/amd64"]
    assert t.for_platform("linux/arm64").as_input()["bases"]["runtime"]["digest"] == INDEX


def test_each_platforms_os_lock_is_resolved_in_a_container_of_that_platform(monkeypatch):
    """cu129's arm64 base is pinned through the index: the resolution must ask for linux/arm64,
    or the engine would run its own machine's image and lock amd64 packages for arm64."""
    from builder.deps import oslock

    class Asked(Exception):
        pass

    seen = []

    class Containers:
        def run_online(self, ref, script, platform=None):
            seen.append((ref, platform))
            raise Asked

    class Engine:
        containers = Containers()

    class Reply:
        def close(self):
            pass

    monkeypatch.setattr(oslock.urllib.request, "urlopen", lambda *a, **k: Reply())
    t = _cu129()
    for view in (t, t.for_platform("linux/amd64"), t.for_platform("linux/arm64")):
        with pytest.raises(Asked):
            oslock.resolve(Engine(), view, "matrix.yaml: ")
    assert [p for _, p in seen] == ["linux/amd64", "linux/amd64", "linux/arm64"]
    assert seen[2][0].endswith(INDEX)
    with pytest.raises(Asked):
        oslock.resolve(Engine(), t.model_copy(update={"platforms": {}}), "matrix.yaml: ")
    assert seen[-1][1] is None  # a one-platform target: the engine's own, as before


@pytest.mark.parametrize(
    ("given", "meant"), [("Linux/AMD64", "linux/amd64"), ("LINUX/ARM64", "linux/arm64"), ("linux/amd46", "linux/amd64")]
)
def test_a_platform_flag_in_capitals_is_told_its_lowercase_form(given, meant):
    """`--platform Linux/AMD64`: refused (a platform is lowercase), with the platform it spells."""
    from builder.config import platforms

    with pytest.raises(ConfigError, match=rf"--platform {given}: .*\(did you mean '{meant}'\?\)"):
        platforms.flag(given)
