"""The driver/CUDA rules of builder/host/compat.py, decision by decision and at every boundary."""

from __future__ import annotations

import pytest

from builder.host import compat
from builder.host.compat import HostGPU, decide

H100, B200, RTX = "NVIDIA H100 80GB HBM3", "NVIDIA B200", "NVIDIA GeForce RTX 4090"


def host(driver, cuda=None, gpus=(H100,), note=""):
    return HostGPU(driver, cuda, tuple(gpus), note)


# --- which GPUs are data-center GPUs -------------------------------------------------------------


@pytest.mark.parametrize(
    "gpus,data_center",
    [
        ((H100, H100), True),
        ((B200,), True),
        (("NVIDIA A100-SXM4-80GB",), True),
        (("Tesla T4", "NVIDIA L40S", "NVIDIA L4", "NVIDIA H20"), True),
        (("NVIDIA A10G",), True),  # AWS g5: nvidia-smi says A10G
        (("NVIDIA GB300",), True),
        ((RTX,), False),
        (("NVIDIA RTX 6000 Ada Generation",), False),
        (("NVIDIA RTX A6000",), False),  # the word A6000 is not A2/A10/A16/...
        (("NVIDIA A1000",), False),
        ((H100, RTX), False),  # a host mixing data-center and consumer GPUs: not a data-center host
        ((RTX, H100), False),
        ((), False),  # no GPU listed: never claimed
    ],
)
def test_data_center_means_every_gpu_is_one(gpus, data_center):
    assert host((575, 57, 8), gpus=gpus).data_center is data_center


def test_host_properties():
    h = host((575, 57, 8))
    assert (h.branch, h.driver_text) == ("r575", "575.57.08")
    assert host((580, 65, 6)).driver_text == "580.65.06"
    assert host((550, 163, 1)).driver_text == "550.163.01"
    assert host((575, 57)).driver_text == "575.57"
    assert host((9, 1, 2)).driver_text == "9.01.02"  # only the branch keeps its own width
    none = host(None)
    assert (none.branch, none.driver_text) == ("none", "none")


# --- reading nvidia-smi --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,fault",
    [
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "no-driver"),
        ("No devices were found", "no-devices"),
        ("blah\nNVIDIA-SMI has failed because of something else\n", "failed"),
        ("Failed to initialize NVML: Driver/library version mismatch\n", "nvml-mismatch"),
        ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.", "no-nvml-library"),
    ],
)
def test_no_driver_outputs(text, fault):
    h = compat.parse_smi(text)
    assert h.driver is None and h.cuda is None and h.gpus == ()
    assert h.note == "nvidia-smi reports no usable driver or GPU" and h.fault == fault and h.nvml is None


def test_a_table_mentioning_no_devices_mid_line_is_not_a_failure():
    # "No devices were found" counts only as nvidia-smi's whole answer (a line of its own).
    h = compat.parse_smi(
        "| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08   CUDA Version: 12.9 |\n"
        "| note: No devices were found earlier |\n"
    )
    assert h.fault is None and h.driver == (575, 57, 8)


def test_table_output():
    text = (
        "| NVIDIA-SMI 575.57.08              Driver Version: 575.57.08      CUDA Version: 12.9     |\n"
        "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |\n"
        "|   1  NVIDIA GeForce RTX 4090        Off |   00000000:2A:00.0 Off |                  N/A |\n"
    )
    h = compat.parse_smi(text)
    assert (h.driver, h.cuda, h.gpus) == ((575, 57, 8), "12.9", (H100, RTX))
    assert not h.data_center


def test_query_output_with_a_two_part_driver_and_no_cuda():
    h = compat.parse_smi("Driver Version : 535.54\nProduct Name : Tesla T4\n")
    assert (h.driver, h.cuda, h.gpus) == ((535, 54), None, ("Tesla T4",))


def test_csv_output():
    h = compat.parse_smi("575.57.08, NVIDIA H100 80GB HBM3\n 575.57.08 , NVIDIA GeForce RTX 4090 \n")
    assert (h.driver, h.cuda, h.gpus) == ((575, 57, 8), None, (H100, RTX))
    assert not h.data_center


@pytest.mark.parametrize("text", ["", "hello", "Driver Version: ???", "12.9, NVIDIA H100", "KMD Version: N/A"])
def test_unreadable_output_is_an_error(text):
    with pytest.raises(compat.SmiParseError) as info:
        compat.parse_smi(text)
    assert str(info.value) == (
        "no 'Driver Version' or 'KMD Version' in the nvidia-smi output; capture `nvidia-smi`, "
        "`nvidia-smi -q` or `nvidia-smi --version`"
    )


def test_a_headerless_wide_csv_says_which_columns_it_needs():
    h = compat.parse_smi("2026/07/14 09:00:27.792, 590.48.01, [N/A], 1, NVIDIA H100 80GB HBM3\n")
    assert h.driver is None and h.form == "csv"
    assert "without its header" in h.missing and "give them with --columns" in h.missing
    assert "doctor reads driver_version (or kmd_version), name, compute_cap" in h.missing


def test_a_csv_header_without_a_version_is_an_error():
    with pytest.raises(compat.SmiParseError, match="a row without a version"):
        compat.parse_smi("name, driver_version\nNVIDIA H100, [N/A]\n")


def test_csv_prefers_the_kmd_version_and_reads_the_driver_model():
    h = compat.parse_smi(
        "name, driver_version, kmd_version, driver_model.current\nNVIDIA GeForce RTX 2080 SUPER, 999.1, 610.62, WDDM\n"
    )
    assert (h.driver, h.gpus, h.platform, h.form) == ((610, 62), ("NVIDIA GeForce RTX 2080 SUPER",), "windows", "csv")
    linux = compat.parse_smi("name,driver_version\nNVIDIA H100,590.48.01\nNVIDIA H100,590.48.01\n")
    assert (linux.driver, linux.platform, len(linux.gpus)) == ((590, 48, 1), "linux", 2)
    named = compat.parse_smi("driver_version, gpu_name, driver_model.current\n575.57.08, NVIDIA L4, [N/A]\n")
    assert (named.gpus, named.platform) == (("NVIDIA L4",), "linux")


def test_bom_and_crlf_are_read():
    table = (
        "| NVIDIA-SMI 576.88     Driver Version: 576.88     CUDA Version: 12.9 |\r\n"
        "|   0  NVIDIA GeForce RTX 4090      WDDM  |   00000000:01:00.0  On |   N/A |\r\n"
    )
    h = compat.parse_smi("\ufeff" + table)
    assert (h.driver, h.cuda, h.gpus, h.platform) == ((576, 88), "12.9", ("NVIDIA GeForce RTX 4090",), "windows")
    assert compat.parse_smi(table.replace("\r\n", "\r")).gpus == ("NVIDIA GeForce RTX 4090",)


@pytest.mark.parametrize(
    "name,kind",
    [
        ("NVIDIA GeForce RTX 2080 ...", "consumer"),  # the table cut it after a whole word
        ("GeForce GTX 108...", "consumer"),
        ("NVIDIA A100-PCI...", "data-center"),  # the cut word (PCI...) is dropped; A100 is whole
        ("Tesla V100-SXM2...", "data-center"),
        ("NVIDIA A10...", "unknown"),  # A10, A100 or A1000? never guessed
        ("NVIDIA H100 80GB HBM3", "data-center"),
        ("NVIDIA RTX PRO 6000 Blac...", "unknown"),  # Workstation or Server Edition (data-center)?
        ("NVIDIA A1000", "consumer"),
        ("NVIDIA Graphics Device", "unknown"),  # a GPU the driver has no name for
        ("NVIDIA A10...  ", "unknown"),  # trailing blanks after the cut
        ("NVIDIA TITAN Xp", "consumer"),
        ("Quadro M1000M", "consumer"),
        ("NVIDIA L4", "data-center"),
    ],
)
def test_gpu_class_of_truncated_names(name, kind):
    assert compat.gpu_class(name) == kind


def test_a_truncated_name_is_never_claimed_for_forward_compatibility():
    h = host((575, 57, 8), gpus=("NVIDIA A10...",))
    assert not h.data_center and h.unsure_gpus == ("NVIDIA A10...",)
    route = decide("13.0.2", h).route
    assert "nvidia-smi cut the name of NVIDIA A10...: capture `nvidia-smi -q` or `nvidia-smi -L`" in route
    assert "is possible" not in route
    assert host((575, 57, 8), gpus=("NVIDIA A100-PCI...",)).unsure_gpus == ()
    # "L4..." can only be an L4, L40 or L40S: all data-center Ada GPUs, so only the A10... is unsure
    two = decide("13.0.2", host((575, 57, 8), gpus=("NVIDIA A10...", "NVIDIA A10...", "NVIDIA L4...", H100))).route
    assert two.endswith(
        "; forward compatibility needs data-center GPUs, and nvidia-smi cut the name of NVIDIA A10...: "
        "capture `nvidia-smi -q` or `nvidia-smi -L` for the full name"
    )


def test_csv_output_of_one_gpu():
    h = compat.parse_smi("575.57.08, NVIDIA H100 80GB HBM3\n")
    assert (h.driver, h.gpus) == ((575, 57, 8), (H100,)) and h.data_center


@pytest.mark.parametrize("text,parsed", [("12.9", (12, 9, 0)), ("12.9.1", (12, 9, 1)), (" 13.0.2\n", (13, 0, 2))])
def test_parse_cuda(text, parsed):
    assert compat.parse_cuda(text) == parsed


@pytest.mark.parametrize("text", ["12", "12.9.1.4", "v12.9", "12.x", ""])
def test_parse_cuda_refuses(text):
    with pytest.raises(ValueError, match="not a CUDA version"):
        compat.parse_cuda(text)


def test_the_image_cuda_is_read_label_first_then_env():
    key = "io.k3-cu129.cuda-version"
    env = {"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.7 brand=tesla,driver>=470"}
    assert compat.image_cuda({key: "12.9.1"}, env, key) == ("12.9.1", f"label {key}")
    assert compat.image_cuda({key: ""}, env, key) == ("12.8.1", "env CUDA_VERSION")
    assert compat.image_cuda({}, {"NVIDIA_REQUIRE_CUDA": env["NVIDIA_REQUIRE_CUDA"]}, key) == (
        "12.7",
        "env NVIDIA_REQUIRE_CUDA",
    )
    assert compat.image_cuda({}, {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0.1 brand=x"}, key) == (
        "13.0.1",
        "env NVIDIA_REQUIRE_CUDA",
    )
    assert compat.image_cuda({}, {"NVIDIA_REQUIRE_CUDA": "brand=tesla"}, key) is None
    assert compat.image_cuda({}, {}, key) is None


# --- the decision --------------------------------------------------------------------------------


def test_no_driver_is_incompatible_and_says_what_to_install():
    v = decide("12.9.1", host(None, note="nvidia-smi not installed"))
    assert v.compatible is False
    assert v.reason == "image needs CUDA 12.9.1 but this host has no usable NVIDIA driver (nvidia-smi not installed)"
    assert v.route == (
        "install a driver (r575 for the cu129 build, r580 for the official CUDA 13 image), then run doctor again"
    )


@pytest.mark.parametrize(
    "cuda,minimum",
    [
        ("12.9.0", "575.51.03"),
        ("12.9.1", "575.57.08"),
        ("13.0.0", "580.65.06"),
        ("13.0.1", "580.82.07"),
        ("13.0.2", "580.95.05"),
    ],
)
def test_full_support_from_exactly_the_release_minimum(cuda, minimum):
    drv = tuple(int(x) for x in minimum.split("."))
    v = decide(cuda, host(drv))
    assert v.compatible and v.route == "run the image as it is"
    assert v.reason == f"CUDA {cuda} needs driver >= {minimum}; host has {minimum} (r{drv[0]})"
    below = decide(cuda, host((drv[0], drv[1], drv[2] - 1)))
    assert below.route != "run the image as it is"  # one patch below: not full support


def test_an_update_not_in_the_table_uses_its_ga_minimum():
    v = decide("12.9.2", host((575, 51, 3)))
    assert v.compatible and v.reason.startswith("CUDA 12.9.2 needs driver >= 575.51.03")


def test_minor_version_compatibility_within_12():
    v = decide("12.9.1", host((575, 51, 3)))  # 12.9 GA driver, 12.9 U1 image
    assert v.compatible
    assert v.reason == (
        "CUDA 12.9.1 runs on driver 575.51.03 (r575) through minor-version compatibility within "
        "CUDA 12.x (family minimum 525.60.13) (full support from 575.57.08); features that need a "
        "newer driver (PTX JIT of newer code) are unavailable"
    )
    assert v.route == "run the image; upgrade the driver within the branch for full support"
    assert decide("12.9.1", host((525, 60, 13))).compatible  # exactly the family minimum
    old = decide("12.9.1", host((525, 60, 12)))
    assert old.compatible is False
    assert old.reason == "CUDA 12.9.1 needs driver >= 575.57.08 (branch r575); host has 525.60.12 (r525)"
    assert old.route == "upgrade the driver to at least 575.57.08"


def test_a_release_not_in_the_table_trusts_the_drivers_own_cuda_version():
    # No table entry for 12.8: nvidia-smi's CUDA Version is the newest CUDA the driver fully supports.
    v = decide("12.8.1", host((570, 86, 10), cuda="12.8"))
    assert v.compatible and v.route == "run the image as it is"
    assert v.reason == "CUDA 12.8.1: host driver 570.86.10 (r570) supports CUDA up to 12.8"
    assert decide("12.8.1", host((570, 86, 10), cuda="12.9")).reason.endswith("supports CUDA up to 12.9")
    older = decide("12.8.1", host((550, 54, 15), cuda="12.4"))
    assert (
        older.compatible and "minor-version compatibility within CUDA 12.x (family minimum 525.60.13);" in older.reason
    )
    assert "full support from" not in older.reason  # no table entry to point at
    # The driver's own claim is only read for a release without a table entry.
    listed = decide("12.9.1", host((560, 35, 3), cuda="12.9"))
    assert "minor-version compatibility" in listed.reason


def test_the_official_cuda13_image_on_r575():
    dc = decide("13.0.2", host((575, 57, 8), gpus=(H100, H100)))
    assert not dc.compatible
    assert dc.reason == "CUDA 13.0.2 needs driver >= 580.95.05 (branch r580); host has 575.57.08 (r575)"
    assert dc.route == (
        "use the cu129 build (this project) on this CUDA 12 driver (r575), or upgrade the driver to "
        "r580+; forward compatibility (cuda-compat-13-0) is possible on these data-center GPUs in "
        "an isolated environment"
    )
    consumer = decide("13.0.2", host((575, 57, 8), gpus=(RTX,)))
    assert consumer.route.endswith("; forward compatibility is not available on these GPUs (data-center GPUs only)")
    mixed = decide("13.0.2", host((575, 57, 8), gpus=(H100, RTX)))
    assert "not available on these GPUs" in mixed.route and "is possible" not in mixed.route


def test_cuda13_within_its_family():
    v = decide("13.0.2", host((580, 65, 6), gpus=(RTX,)))  # 13.0 GA driver: minor-version compatible
    assert v.compatible and "within CUDA 13.x (family minimum 580.65.06) (full support from 580.95.05)" in v.reason
    assert not decide("13.0.0", host((580, 65, 5))).compatible


def test_a_major_without_a_family_entry():
    # CUDA 14 on a 580 driver: nothing in the tables; not the CUDA-12-driver route either.
    v = decide("14.0.0", host((580, 65, 6)))
    assert not v.compatible
    assert v.reason == "CUDA 14.0.0 is not in the compatibility table; host has 580.65.06 (r580)"
    assert v.route == "upgrade the driver"
    # ... but on a CUDA 12 driver it is: the cu129 build is the way.
    below = decide("14.0.0", host((580, 65, 5)))
    assert below.route.startswith("use the cu129 build")
    assert decide("14.0.0", host((580, 65, 6), cuda="14.0")).compatible  # the driver says it supports 14.0
    assert not decide("14.1.0", host((580, 65, 6), cuda="14.0")).compatible


def test_cuda11_on_an_old_driver():
    v = decide("11.8.0", host((470, 82, 1)))
    assert v.compatible is False and v.route == "upgrade the driver"
    assert v.reason == "CUDA 11.8.0 is not in the compatibility table; host has 470.82.01 (r470)"


def test_a_bad_version_is_a_value_error():
    with pytest.raises(ValueError):
        decide("twelve", host((575, 57, 8)))


# --- broken hosts and Windows drivers --------------------------------------------------------------


@pytest.mark.parametrize(
    "fault,state,route",
    [
        (
            "nvml-mismatch",
            "the loaded NVIDIA kernel module and the user-space driver library differ (a driver",
            "reboot the host, or stop every GPU process and reload the NVIDIA kernel modules",
        ),
        ("no-nvml-library", "nvidia-smi finds no libnvidia-ml.so", "on a host, install the NVIDIA driver"),
        ("no-driver", "couldn't communicate with the NVIDIA driver", "install a driver (r575 for the cu129 build"),
        ("no-devices", "the NVIDIA driver is loaded but reports no GPU", "make the GPU visible"),
        ("failed", "nvidia-smi failed", "install or repair the driver"),
    ],
)
def test_a_broken_host_is_a_verdict_with_a_route_and_evidence(fault, state, route):
    v = decide("12.9.1", HostGPU(None, None, (), fault=fault))
    assert v.compatible is False
    assert v.reason.startswith("image needs CUDA 12.9.1 but this host has no usable NVIDIA driver: ")
    assert state in v.reason and v.route.startswith(route) and v.save
    assert v.save == compat.BROKEN[fault][2]


def test_the_mismatch_names_the_user_space_library():
    v = decide("12.9.1", HostGPU(None, None, (), fault="nvml-mismatch", nvml="570.124"))
    assert "driver library differ (user-space NVML library 570.124) (a driver upgraded" in v.reason
    assert "/proc/driver/nvidia/version" in v.save


def test_cuda13_on_a_driver_below_cuda12_is_not_sent_to_the_bridge():
    v = decide("13.0.2", host((470, 82, 1)))
    assert v.route == "upgrade the driver to r580+ (even the cu129 build needs a CUDA 12 driver, >= 525.60.13)"
    assert v.compatible is False
    assert v.reason == "CUDA 13.0.2 needs driver >= 580.95.05 (branch r580); host has 470.82.01 (r470)"
    assert decide("13.0.2", host((525, 60, 13))).route.startswith("use the cu129 build")
    assert decide("13.0.2", host((525, 60, 12))).route.startswith("upgrade the driver to r580+")


def win(driver, cuda, platform="windows"):
    return HostGPU(driver, cuda, (RTX,), platform=platform)


def test_a_windows_driver_is_judged_by_the_cuda_it_reports():
    ok = decide("12.9.1", win((576, 88), "12.9"))
    assert ok.compatible and ok.route == "run the image as it is"
    assert ok.reason == f"CUDA 12.9.1: 576.88 is a Windows driver that reports CUDA up to 12.9 ({compat.WINDOWS_TABLE})"
    assert decide("12.9.1", win((610, 62), "13.3")).compatible
    # The Linux table is never applied to a Windows version: 576.88 >= 575.57.08 means nothing there.
    low = decide("12.9.1", win((576, 2), "12.8"))
    assert not low.compatible and "reports CUDA up to 12.8; minor-version compatibility would need" in low.reason
    assert low.route.startswith("upgrade the Windows driver to one that reports CUDA 12.9 or newer")
    assert low.route.endswith("; forward compatibility (cuda-compat) is not assessed for this driver")


def test_the_official_image_on_a_cuda12_windows_or_wsl_driver():
    v = decide("13.0.2", win((555, 99), "12.5", platform="wsl"))
    assert not v.compatible and "555.99 is a WSL host's Windows driver that reports CUDA up to 12.5" in v.reason
    assert v.route.startswith("use the cu129 build (this project) on this CUDA 12 driver, or upgrade the Windows")
    none = decide("12.9.1", win((546, 80), None, platform="wsl"))
    assert not none.compatible and "reports no CUDA version" in none.reason
    assert decide("13.0.2", win((546, 80), None)).route == (
        "upgrade the Windows driver to one that reports CUDA 13.0 or newer (NVIDIA's table gives the minimum); "
        "forward compatibility (cuda-compat) is not assessed for this driver"
    )
    assert v.route == (
        "use the cu129 build (this project) on this CUDA 12 driver, or upgrade the Windows driver to "
        "one that reports CUDA 13; forward compatibility (cuda-compat) is not assessed for this driver"
    )
    assert none.reason == (
        f"CUDA 12.9.1: 546.80 is a WSL host's Windows driver that reports no CUDA version; "
        f"minor-version compatibility would need the Windows family minimum, not confirmed here "
        f"({compat.WINDOWS_TABLE})"
    )
    # a CUDA 11 Windows driver is not sent to the cu129 bridge
    assert decide("13.0.2", win((472, 12), "11.4")).route.startswith("upgrade the Windows driver to one that reports")
    assert decide("12.9.1", win((610, 62), "12.9")).compatible  # exactly the image's major.minor


@pytest.mark.parametrize(
    "text,platform",
    [
        # WSL: Linux's nvidia-smi reporting the Windows driver (--version and table forms)
        (
            "NVIDIA-SMI version  : 580.82.07\nNVML version        : 580.95\nDRIVER version      : 581.42\n"
            "CUDA Version        : 13.0\n",
            "wsl",
        ),
        ("| NVIDIA-SMI 545.46                 Driver Version: 546.80       CUDA Version: 12.3     |\n", "wsl"),
        # the Windows table of older drivers: "TCC/WDDM" column, the model right after a cut name
        (
            "| NVIDIA-SMI 517.48       Driver Version: 517.48       CUDA Version: 11.7     |\n"
            "| GPU  Name            TCC/WDDM | Bus-Id        Disp.A | Volatile Uncorr. ECC |\n"
            "|   0  NVIDIA GeForce ... WDDM  | 00000000:0A:00.0  On |                  N/A |\n",
            "windows",
        ),
        (
            "| NVIDIA-SMI 580.88   Driver Version: 580.88   CUDA Version: 13.0 |\n"
            "|   0  NVIDIA RTX PRO 6000 Blackwell ... MCDM  | 00000000:0A:00.0 Off | Off |\n",
            "windows",
        ),
        (
            "Driver Version : 576.02\nCUDA Version : 12.9\nDriver Model\n    Current : TCC\n    Pending : TCC\n",
            "windows",
        ),
        # Linux, a two-part version included: nvidia-smi and the driver agree
        ("| NVIDIA-SMI 595.80                 Driver Version: 595.80         CUDA Version: 13.2     |\n", "linux"),
        ("Driver Version : 580.82.07\nDriver Model\n    Current : N/A\n", "linux"),
        ("| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |\n", "linux"),
    ],
)
def test_the_platform_of_a_driver(text, platform):
    assert compat.parse_smi(text).platform == platform


def test_the_old_windows_table_names_its_gpus():
    h = compat.parse_smi(
        "| NVIDIA-SMI 517.48       Driver Version: 517.48       CUDA Version: 11.7     |\n"
        "|   0  NVIDIA GeForce ... WDDM  | 00000000:0A:00.0  On |                  N/A |\n"
        "|   1  NVIDIA GeForce ... WDDM  | 00000000:43:00.0  On |                  N/A |\n"
    )
    assert h.gpus == ("NVIDIA GeForce ...",) * 2 and not h.data_center and h.unsure_gpus == ()


def test_table_rows_never_run_into_the_next_cell_or_the_processes():
    text = (
        "| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08   CUDA Version: 12.9 |\n"
        "|   0  Tesla T4            N/A  | 00000000:00:04.0 Off |                    0 |\n"
        "| Processes:                                                                  |\n"
        "|    0   N/A  N/A      2140    C+G   C:\\Windows\\System32\\dwm.exe    N/A      |\n"
        "|    1   N/A  N/A      2141    C   python                        On |\n"
    )
    # Persistence-M N/A (a Jetson prints it) before a Bus-Id is a GPU row; the process rows never are
    assert compat.parse_smi(text).gpus == ("Tesla T4",)
    rows = text.replace("00000000:00:04.0", "        ").replace("Tesla T4  ", "Tesla T4 X")
    assert compat.parse_smi(rows).gpus == ()  # no Bus-Id cell after the name: not a GPU row


@pytest.mark.parametrize(
    "text,cuda,note",
    [
        ("Driver Version: 575.57.08  CUDA UMD Version: 13.3  CUDA Version: 12.9", "13.3", ""),
        ("Driver Version: 575.57.08  CUDA Version: N/A", None, "'CUDA Version: N/A'"),
        ("Driver Version: 575.57.08  CUDA Version: ERR!", None, "'CUDA Version: ERR!'"),
        ("Driver Version: 575.57.08", None, ""),
    ],
)
def test_the_drivers_cuda_version(text, cuda, note):
    h = compat.parse_smi(text)
    assert h.cuda == cuda and (note in h.note if note else h.note == "")


@pytest.mark.parametrize(
    "text,driver,gpus",
    [
        ("driver_version\n575.57.08\n", (575, 57, 8), ()),  # no name column: no GPU names
        (
            "timestamp, name, driver_version, pstate\n2026/07/14, NVIDIA L4, 550.163.01, P8\n",
            (550, 163, 1),
            ("NVIDIA L4",),
        ),
        ("575.57.08, NVIDIA H100\n", (575, 57, 8), ("NVIDIA H100",)),
    ],
)
def test_csv_columns(text, driver, gpus):
    h = compat.parse_smi(text)
    assert (h.driver, h.gpus, h.form, h.platform, h.cuda) == (driver, gpus, "csv", "linux", None)


@pytest.mark.parametrize(
    "text,message",
    [
        ("name, driver_version\n", "a row without a version"),  # the header alone
        ("name, driver_version\nNVIDIA H100\n", "rows do not have the 2 columns"),
    ],
)
def test_csv_refusals(text, message):
    with pytest.raises(compat.SmiParseError, match=message):
        compat.parse_smi(text)


@pytest.mark.parametrize("text", ["575.57.08, NVIDIA H100, P8\n", "2026/07/14, 590.48.01, NVIDIA H100\n"])
def test_headerless_csvs_name_the_columns_they_need(text):
    h = compat.parse_smi(text)
    assert h.driver is None and h.missing.startswith("a --query-gpu CSV without its header")


def test_a_tcc_csv_row_is_windows():
    assert compat.parse_smi("name, driver_version, driver_model.current\nTesla T4, 576.02, TCC\n").platform == "windows"
    two = "name, driver_version, driver_model.current\nA, 576.02, WD\nB, 576.02, DM\n"  # "WD DM" is no model
    assert compat.parse_smi(two).platform == "linux"
    blank = "name, driver_version, driver_model.current\nA, 576.02,\nB, 576.02, TCC\n"
    assert compat.parse_smi(blank).platform == "windows"


def test_a_container_with_a_newer_nvidia_smi_than_its_driver_is_not_wsl():
    h = compat.parse_smi("| NVIDIA-SMI 575.57.08    Driver Version: 570.124.06    CUDA Version: 12.8 |\n")
    assert (h.platform, h.driver) == ("linux", (570, 124, 6))


def test_forms():
    assert compat.parse_smi("Driver Version : 575.57.08\n").form == "query"
    assert compat.parse_smi("| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08 |\n").form == "table"
    assert compat.parse_smi("x\n| NVIDIA-SMI 331.62     Driver Version: 331.62         |\n").form == "table"
    assert compat.parse_smi("NVIDIA-SMI version  : 590.48.01\nDRIVER version      : 590.48.01\n").form == "version"


def test_a_mig_section_at_the_end_of_the_output():
    text = (
        "| NVIDIA-SMI 590.48.01   Driver Version: 590.48.01   CUDA Version: 13.1 |\n"
        "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:09.0 Off |   On |\n\n"
        "| MIG devices:                                  |\n"
        "|  0    2   0   0  |  26MiB / 40448MiB | 60  0 |\n"
        "|  0    3   0   1  |  17MiB / 20096MiB | 32  0 |"
    )
    h = compat.parse_smi(text)
    assert (h.mig_devices, h.gpus) == (2, ("NVIDIA H100 80GB HBM3",))
    assert compat.parse_smi(text + "\n\n|  0    9   0   2  |  not MIG: after the section |\n").mig_devices == 2
