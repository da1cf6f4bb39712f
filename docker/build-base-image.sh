#!/usr/bin/env bash
# Build the local base image of the node image: Debian bookworm made with
# debootstrap and `docker import`ed, for machines that cannot pull from a
# registry. With a registry, skip this and build the node image with
# BASE_IMAGE=debian:bookworm (or python:3.11-slim-bookworm) instead.
#
#   docker/build-base-image.sh [IMAGE]     default tfcluster/bookworm-base:local
#
# Does nothing when IMAGE exists (FORCE=1 rebuilds). Needs root (or sudo) for
# debootstrap, and debootstrap itself (scripts/install-system-deps.sh).
# DEBIAN_MIRROR overrides the mirror (default: deb.debian.org).
set -euo pipefail

image="${1:-${BASE_IMAGE_LOCAL:-tfcluster/bookworm-base:local}}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
# What a fresh GCE Debian 12 VM has that the nodes rely on, plus sshd. Kept
# to what the image needs: the node image adds nothing from apt, so it builds
# with no network at all.
include=python3,python3-venv,openssh-server,rsync,sudo,ca-certificates,procps,iproute2,netbase

if docker image inspect "$image" >/dev/null 2>&1 && [ "${FORCE:-0}" != 1 ]; then
    echo "build-base-image: $image exists (FORCE=1 rebuilds)"
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi
if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then
    echo "build-base-image: debootstrap is missing; run scripts/install-system-deps.sh" >&2
    exit 1
fi

rootfs="$(mktemp -d "${TMPDIR:-/tmp}/tfcluster-rootfs.XXXXXX")"
cleanup() { "${sudo[@]}" rm -rf "$rootfs"; }
trap cleanup EXIT

echo "build-base-image: debootstrap $suite into $rootfs (about a minute)"
"${sudo[@]}" debootstrap --variant=minbase --include="$include" "$suite" "$rootfs" "$mirror" \
    > "$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"

# Slim it down, and drop what must differ per machine: host keys (each node
# generates its own at first start, as a VM does) and the machine id.
"${sudo[@]}" rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/etc/ssh/ssh_host_* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
"${sudo[@]}" truncate -s 0 "$rootfs/etc/machine-id"
# The same sources a VM has, so `apt-get` on a node works where it has network.
echo "deb $mirror $suite main" | "${sudo[@]}" tee "$rootfs/etc/apt/sources.list" >/dev/null

echo "build-base-image: importing as $image"
"${sudo[@]}" tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$image" >/dev/null
echo "build-base-image: built $image ($(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=iec))"
