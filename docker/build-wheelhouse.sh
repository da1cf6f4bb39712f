#!/usr/bin/env bash
# Download the trainer's pinned dependencies as wheels for the nodes' Python
# (CPython 3.11, x86_64 manylinux: Debian bookworm), so nodes with no PyPI
# access install with `pip --no-index --find-links` (setup.wheelhouse) and
# the node image can bake them in (Dockerfile, ARG BAKE_VENV=1).
#
#   docker/build-wheelhouse.sh [DIR]     default .cache/wheelhouse
#
# Fast when nothing changed: a stamp holds the hash of the requirements it
# was made from, and pip's cache serves repeated downloads.
set -euo pipefail
cd "$(dirname "$0")/.."

dest="${1:-.cache/wheelhouse}"
requirements="${REQUIREMENTS:-trainer/requirements.txt}"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3

# The exact versions CI tests, dependencies too (what setup installs the
# default requirements with): the wheelhouse must hold those very wheels.
constraints="${CONSTRAINTS:-constraints.txt}"
want="$(cat "$requirements" "$(dirname "$requirements")/requirements-no-deps.txt" "$constraints" \
    2>/dev/null | sha256sum | cut -d' ' -f1)"
if [ -f "$dest/.requirements.sha256" ] && [ "$(cat "$dest/.requirements.sha256")" = "$want" ]; then
    echo "build-wheelhouse: $dest is up to date ($(ls "$dest"/*.whl | wc -l) wheels)"
    exit 0
fi

mkdir -p "$(dirname "$dest")"
# Every manylinux tag a bookworm (glibc 2.36) x86_64 node accepts: pip does
# not widen an explicit --platform to older compatible tags by itself.
platforms=()
for tag in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 \
    manylinux_2_36_x86_64; do
    platforms+=(--platform "$tag")
done
echo "build-wheelhouse: downloading $requirements into $dest"
# Into a fresh folder, then swapped in: a wheel of an older pin left behind
# would change the wheelhouse listing (part of the install marker's hash)
# and confuse pip's choice. pip's cache makes the re-download cheap.
rm -rf "$dest.new"
cons=()
[ -f "$constraints" ] && cons=(-c "$constraints")
"$python" -m pip download -q -r "$requirements" "${cons[@]}" -d "$dest.new" \
    --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 "${platforms[@]}"
# What the nodes install without dependencies (tf-keras: it would pull the
# `tensorflow` wheel beside tensorflow-cpu), beside the requirements file.
no_deps="$(dirname "$requirements")/requirements-no-deps.txt"
if [ -f "$no_deps" ]; then
    "$python" -m pip download -q --no-deps -r "$no_deps" "${cons[@]}" -d "$dest.new" \
        --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 "${platforms[@]}"
fi
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "$want" > "$dest/.requirements.sha256"
echo "build-wheelhouse: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1)"
