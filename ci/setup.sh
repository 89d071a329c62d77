#!/usr/bin/env bash
# Installs and starts what the pipeline needs, only where it is missing:
#   - Docker Engine >= 25 with buildx >= 0.13 (Debian 13's docker.io/docker-buildx on Debian 12,
#     through a trixie apt source pinned low so nothing else is upgraded from it);
#   - a local OCI registry (Debian's docker-registry, distribution 2.8) on 127.0.0.1:5000;
#   - debootstrap (the smoke target's base image is made from Debian's archive);
#   - the project itself in a venv at .venv (pip install -e .[test]).
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
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    # Debian 12's docker.io is 20.10 without buildx; take both from trixie, pinned low.
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
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t trixie docker.io docker-buildx >/dev/null
  else
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io docker-buildx >/dev/null
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

if ! command -v debootstrap >/dev/null 2>&1; then
  need_root; apt_update_once
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
start_registry

# The project in its own venv; pip's machine config (extra indexes, caps) is ignored so the
# install resolves from PyPI alone, like the locks do.
if [ ! -x "$here/.venv/bin/build" ] || [ "$here/pyproject.toml" -nt "$here/.venv/.installed" ]; then
  log "installing the project into .venv"
  python3 -m venv "$here/.venv"
  PIP_CONFIG_FILE=/dev/null "$here/.venv/bin/pip" install -q --upgrade pip
  PIP_CONFIG_FILE=/dev/null "$here/.venv/bin/pip" install -q -e "$here[test]"
  touch "$here/.venv/.installed"
fi
log "ready: engine $have, buildx $bx, registry http://$REGISTRY_ADDR"
