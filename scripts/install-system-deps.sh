#!/usr/bin/env bash
# System packages the docker tests and `make cluster-image` need on the host:
#   debootstrap  builds the local bookworm base image (no registry to pull from)
#   rsync        incremental sync to the nodes (setup falls back to tar without it)
#   openssh-client  `deploy.py ssh` and rsync's transport
#   docker-compose  only where Docker is installed without any compose
#                   (`docker compose` v2 or `docker-compose` v1 both work)
# Idempotent: installs only what is missing, runs apt-get update at most once,
# works as root or through sudo. Debian/Ubuntu only; elsewhere it says what to
# install and exits 0 (tfcluster itself still works; the docker tests skip).
set -euo pipefail

packages=(debootstrap rsync openssh-client ca-certificates)
if command -v docker >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1 \
    && ! command -v docker-compose >/dev/null 2>&1; then
    packages+=(docker-compose)
fi

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: no apt-get here; install yourself: ${packages[*]}" >&2
    exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-system-deps: all present (${packages[*]})"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo -n)
else
    echo "install-system-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
fi

echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-system-deps: done"
