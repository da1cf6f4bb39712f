#!/bin/bash
# Bake the trainer's venv into a node, as the login user, from a wheelhouse:
# what `deploy.py up` would install, plus the install marker that the probe
# of infra/setup/commands.py compares, so that `up` on such a node has nothing to install.
#
#   tfcluster-bake WHEELHOUSE REQUIREMENTS REMOTE_DIR MARKER
#
# Used by the Dockerfile (ARG BAKE_VENV=1) and by docker/build-node-image.sh
# (which runs it in a container of the bare image and commits the result:
# the same venv, without the classic builder's slow copies of the wheels).
set -euo pipefail
wheelhouse="$1" requirements="$2" remote_dir="$3" marker="$4"
if [ -z "$marker" ]; then
    echo "tfcluster-bake: no install marker given (python -m tfcluster_cli.compose marker)" >&2
    exit 1
fi
root="$HOME/$remote_dir"
mkdir -p "$root"
python3 -m venv "$root/venv"
"$root/venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check \
    --no-index --find-links "$wheelhouse" -r "$requirements"
# Beside the requirements: what goes in without its dependencies (tf-keras),
# as infra/setup/commands.py installs it.
no_deps="$(dirname "$requirements")/requirements-no-deps.txt"
if [ -f "$no_deps" ]; then
    "$root/venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check \
        --no-index --find-links "$wheelhouse" --no-deps -r "$no_deps"
fi
# Last: a venv without its marker is one that `up` installs again.
printf '%s\n' "$marker" > "$root/venv/.tfcluster-install"
