#!/usr/bin/env bash
# Installs and starts what the pipeline and its tests need, only where it is missing (every apt
# install is --no-install-recommends and upgrades nothing; the host's default python3 is untouched):
#   - Docker Engine >= 25 with buildx >= 0.13: on Debian 12 the docker.io, docker-cli and
#     docker-buildx packages of Debian 13, named one by one (pkg/trixie) from a trixie apt source
#     pinned at priority 100, so their dependencies come from Debian 12 (no libc6 or base-files
#     upgrade); elsewhere the distribution's own docker.io (+ docker-cli where it is split out);
#   - a local OCI registry (Debian's docker-registry, distribution 2.8) on 127.0.0.1:5000;
#   - mmdebstrap, and debootstrap (whose function mmdebstrap's merged-usr hook calls): the smoke
#     target's base images are made from Debian's archive;
#   - linux/arm64 for the smoke (unless K3_SETUP_ARM64=0): arch-test (mmdebstrap asks it whether
#     arm64 runs here), and on a non-arm64 host arm64 emulation: Debian's qemu-user-static and
#     binfmt-support, binfmt_misc mounted if it is not, and the qemu-aarch64 handler registered in
#     the kernel (with the F flag, so containers and chroots of another root find the
#     interpreter); each step says what it did; where the kernel refuses, a warning (an error
#     with K3_SETUP_ARM64=1);
#   - gcc and libc6-dev where no C compiler is (the probe unit tests compile ELF files);
#   - apache2-utils (htpasswd: the credential tests run a registry that requires a password);
#   - redis-server (Debian's): the compile-cache test and benchmark start their own instance on
#     the engine's bridge, on a free port, and stop it; if installing it started the packaged
#     service, that service is stopped and disabled again (nothing listens after setup);
#   - python3-venv where `python3 -m venv` cannot make a venv with pip;
#   - the tool's own environment in a venv at .venv, from the hash-locked ci/requirements.lock
#     (pip, setuptools and every test, lint and docs tool included), then the project itself
#     editable with no dependency resolution: two CI runs test the same code.
# Idempotent: a second run finds everything present and running and changes nothing.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
REGISTRY_ADDR=${REGISTRY_ADDR:-127.0.0.1:5000}
STATE_DIR=${K3_STATE_DIR:-/var/lib/k3-builder}
log() { printf '[setup] %s\n' "$*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "ci/setup.sh: must run as root to install packages and start dockerd (try: sudo ci/setup.sh)" >&2
    exit 2
  fi
}

version_ge() { # version_ge HAVE WANT
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

apt_updated=0
apt_update_once() {
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
}

engine_version() { docker version --format '{{.Server.Version}}' 2>/dev/null || true; }
buildx_version() { docker buildx version 2>/dev/null | awk '{print $2}' | sed 's/^v//; s/+.*//' || true; }

install_engine() {
  need_root
  # shellcheck source=/dev/null
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    # Debian 12's docker.io is 20.10 without buildx; take the engine, client and buildx from trixie.
    if [ ! -f /etc/apt/sources.list.d/k3-trixie.sources ]; then
      log "adding a low-priority trixie apt source for docker.io and docker-buildx"
      cat > /etc/apt/sources.list.d/k3-trixie.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
      cat > /etc/apt/preferences.d/k3-trixie <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
      apt_updated=0
    fi
    apt_update_once
    # Only these three from trixie (pkg/release, not -t trixie): with -t trixie apt takes every
    # dependency from trixie too and upgrades libc6, libstdc++6, dpkg and base-files (the host then
    # calls itself Debian 13). trixie's docker.io needs only libc6 >= 2.34; bookworm has 2.36.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      docker.io/trixie docker-cli/trixie docker-buildx/trixie >/dev/null
  else
    apt_update_once
    pkgs="docker.io docker-buildx"
    # Since Debian 13 the docker client is its own package, only a Recommends of docker.io.
    if apt-cache show docker-cli >/dev/null 2>&1; then pkgs="$pkgs docker-cli"; fi
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  fi
}

start_dockerd() {
  if docker info >/dev/null 2>&1; then return; fi
  need_root
  log "starting dockerd"
  mkdir -p "$STATE_DIR"
  if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
    systemctl start docker || true
  fi
  if ! docker info >/dev/null 2>&1; then
    # A dockerd killed with its session leaves pid files that make the next one refuse to start.
    # A pid is stale when no live (non-zombie) dockerd/containerd has it any more.
    for pidfile in /var/run/docker.pid /run/docker/containerd/containerd.pid; do
      [ -f "$pidfile" ] || continue
      pid=$(cat "$pidfile" 2>/dev/null || true)
      state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
      comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
      case "$comm" in dockerd|containerd) [ "$state" != Z ] && continue ;; esac
      rm -f "$pidfile"
    done
    nohup /usr/sbin/dockerd --storage-driver=overlay2 >"$STATE_DIR/dockerd.log" 2>&1 &
  fi
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return
    sleep 1
  done
  echo "ci/setup.sh: dockerd did not come up within 60 s; see $STATE_DIR/dockerd.log" >&2
  tail -n 20 "$STATE_DIR/dockerd.log" >&2 || true
  exit 1
}

registry_up() { curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; }

start_registry() {
  if registry_up; then return; fi
  need_root
  if ! command -v docker-registry >/dev/null 2>&1; then
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
  fi
  mkdir -p "$STATE_DIR/registry"
  cat > "$STATE_DIR/registry.yml" <<CFG
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE_DIR/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
CFG
  # Debian's package starts its own service on :5000 where systemd runs; otherwise start it here.
  log "starting docker-registry on $REGISTRY_ADDR"
  nohup docker-registry serve "$STATE_DIR/registry.yml" >"$STATE_DIR/registry.log" 2>&1 &
  for _ in $(seq 1 30); do
    registry_up && return
    sleep 0.5
  done
  echo "ci/setup.sh: registry did not answer on http://$REGISTRY_ADDR/v2/; see $STATE_DIR/registry.log" >&2
  exit 1
}

have=$(engine_version)
bx=$(buildx_version)
if [ -z "$have" ] && command -v dockerd >/dev/null 2>&1 && [ -n "$bx" ] && version_ge "$bx" 0.13 \
   && version_ge "$(dockerd --version | sed -E 's/^Docker version ([0-9.]+).*/\1/')" 25; then
  :  # installed, not running
elif [ -z "$have" ] || ! version_ge "$have" 25 || [ -z "$bx" ] || ! version_ge "$bx" 0.13; then
  if ! command -v dockerd >/dev/null 2>&1 || [ -z "$bx" ] || ! version_ge "$bx" 0.13 \
     || ! version_ge "$(dockerd --version | sed -E 's/^Docker version ([0-9.]+).*/\1/')" 25; then
    log "installing Docker Engine >= 25 and buildx >= 0.13"
    install_engine
  fi
fi
start_dockerd
have=$(engine_version); bx=$(buildx_version)
version_ge "$have" 25 || { echo "ci/setup.sh: Docker Engine $have < 25" >&2; exit 1; }
version_ge "$bx" 0.13 || { echo "ci/setup.sh: buildx $bx < 0.13" >&2; exit 1; }

# The smoke's bases: one mmdebstrap run per architecture (builder/smoke/smokeroots.py); its
# merged-usr hook merges /usr with debootstrap's own function.
if ! command -v mmdebstrap >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  need_root; apt_update_once
  log "installing mmdebstrap and debootstrap (the smoke's base images)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap debootstrap >/dev/null
fi
start_registry

# linux/arm64 for the smoke, by default (K3_SETUP_ARM64=0 skips it, K3_SETUP_ARM64=1 makes any
# failure fatal): `build smoke-init --arm64` makes the smoke's linux/arm64 bases with mmdebstrap,
# whose packages' maintainer scripts run under QEMU (docs/smoke.md has what that costs: a few
# CPU-minutes once per machine, seconds once cached). mmdebstrap needs arch-test to see that arm64
# runs here. binfmt_misc is a kernel filesystem: mounted here when the machine did not (a container
# often has the directory and nothing in it). update-binfmts registers what qemu-user-static
# declares; Debian's entries carry the F flag, so the engine's containers and a chroot of another
# root use the host's interpreter. By default a machine that cannot register it (a container
# without the privilege) gets a warning, not a failed setup: only the arm64 leg needs it (ci/demo.sh
# then builds linux/amd64 alone; the tests' arm64 leg is skipped, saying why, or under CI fails).
arm64_want=${K3_SETUP_ARM64:-default}
arm64_ready() { [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || [ "$(uname -m)" = aarch64 ]; }
if [ "$arm64_want" != 0 ]; then
  if ! command -v arch-test >/dev/null 2>&1; then
    need_root; apt_update_once
    log "installing arch-test (mmdebstrap's check that linux/arm64 runs here)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends arch-test >/dev/null
  fi
fi
if [ "$arm64_want" != 0 ] && ! arm64_ready; then
  need_root
  if ! command -v qemu-aarch64-static >/dev/null 2>&1 || ! command -v update-binfmts >/dev/null 2>&1; then
    apt_update_once
    log "installing qemu-user-static and binfmt-support (emulated linux/arm64 for the smoke)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static binfmt-support >/dev/null
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    log "mounting binfmt_misc on /proc/sys/fs/binfmt_misc (it was not mounted)"
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || true
  fi
  if [ -e /proc/sys/fs/binfmt_misc/status ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    log "registering the qemu-aarch64 binfmt handler in the kernel"
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || update-binfmts --import qemu-aarch64 || true
  fi
  if ! arm64_ready; then
    if [ "$arm64_want" = 1 ]; then
      echo "ci/setup.sh: could not register the qemu-aarch64 handler (binfmt_misc)" >&2
      exit 1
    fi
    log "warning: could not register the qemu-aarch64 handler (binfmt_misc): no linux/arm64 here (build smoke-init --arm64 fails)"
  fi
fi

# A C compiler: the probe unit tests compile the ELF files they resolve (a Python machine has one;
# a bare Debian may not). The smoke's stub libcuda.so.1 is compiled inside each base by its own cc.
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  need_root; apt_update_once
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
fi

# htpasswd, for the registry that requires a password in tests/integration/test_registry_auth.py.
if ! command -v htpasswd >/dev/null 2>&1; then
  need_root; apt_update_once
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends apache2-utils >/dev/null
fi

if ! command -v redis-server >/dev/null 2>&1; then
  need_root; apt_update_once
  log "installing redis-server (a compile-cache backend for the tests and benchmark)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled redis-server >/dev/null 2>&1; then
    systemctl disable --now redis-server >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/redis-server ]; then
    /etc/init.d/redis-server stop >/dev/null 2>&1 || true
  fi
fi

# `python3 -m venv` needs ensurepip, which Debian ships in python3-venv (for .venv here and the
# fresh venv tests/integration/test_install.py installs the built wheel into).
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need_root; apt_update_once
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi

# The tool's own environment, locked: every distribution by version and sha256, installed with
# --require-hashes --no-deps from PyPI alone (pip's machine config is ignored, like the locks do).
# `pip install .` elsewhere still resolves the ranges in pyproject.toml; ci/lock-tools.sh moves
# the lock. The lock is for Python >= 3.11 (mkdocs-material's floor).
lockfile="$here/ci/requirements.lock"
if [ ! -x "$here/.venv/bin/build" ] || [ "$here/pyproject.toml" -nt "$here/.venv/.installed" ] \
   || [ "$lockfile" -nt "$here/.venv/.installed" ]; then
  log "installing the locked tool environment and the project into .venv"
  python3 -m venv "$here/.venv"
  PIP_CONFIG_FILE=/dev/null "$here/.venv/bin/pip" install -q --require-hashes --no-deps \
    --index-url https://pypi.org/simple -r "$lockfile"
  PIP_CONFIG_FILE=/dev/null "$here/.venv/bin/pip" install -q --no-deps --no-build-isolation -e "$here"
  PIP_CONFIG_FILE=/dev/null "$here/.venv/bin/pip" check >/dev/null
  touch "$here/.venv/.installed"
fi
# Bytecode for the tool's own modules (an editable install leaves them as sources): where the
# environment sets PYTHONDONTWRITEBYTECODE, every command would otherwise recompile them (~50 ms).
"$here/.venv/bin/python" -m compileall -q "$here/builder" >/dev/null || true
log "ready: engine $have, buildx $bx, registry http://$REGISTRY_ADDR"
