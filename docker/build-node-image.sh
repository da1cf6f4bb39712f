#!/usr/bin/env bash
# Build the tfcluster node image, and what it needs first:
#   - the local base image (docker/build-base-image.sh), unless BASE_IMAGE is set
#   - the wheelhouse (docker/build-wheelhouse.sh) and the install marker, when baking
#
#   docker/build-node-image.sh            # tfcluster/node:local, venv baked in
#   BAKE_VENV=0 NODE_IMAGE=tfcluster/node-bare:local docker/build-node-image.sh
#
# Baking (BAKE_VENV=1) first builds the bare image (NODE_BARE_IMAGE), then
# runs docker/bake-venv.sh in a container of it with the wheelhouse mounted
# and commits that: the Dockerfile's own BAKE_VENV=1 path gives the same
# image, but the classic builder's copies of the wheels and of the venv
# layer take minutes longer (BAKE_METHOD=build uses it anyway).
#
# Skips whatever was built from the same inputs (an image label holds their
# hash), so tests and `make cluster-up` call it every time.
# Env: NODE_IMAGE, NODE_BARE_IMAGE, BASE_IMAGE, BAKE_VENV (1), BAKE_METHOD
# (commit), CLUSTER_CONFIG (whose install marker is baked: examples/compose.yaml),
# PYTHON (.venv/bin/python), FORCE=1 (rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."

image="${NODE_IMAGE:-tfcluster/node:local}"
bare="${NODE_BARE_IMAGE:-tfcluster/node-bare:local}"
bake="${BAKE_VENV:-1}"
method="${BAKE_METHOD:-commit}"
config="${CLUSTER_CONFIG:-examples/compose.yaml}"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3

if [ -z "${BASE_IMAGE:-}" ]; then
    BASE_IMAGE=tfcluster/bookworm-base:local
    bash docker/build-base-image.sh "$BASE_IMAGE"
fi

# The wheels by name and size, as the install marker lists them: not `ls -l`,
# whose times differ in every clone and made each one bake again.
wheels() { (cd .cache/wheelhouse && stat -c '%n %s' -- *.whl | LC_ALL=C sort); }
label() { docker image inspect -f '{{index .Config.Labels "tfcluster.inputs"}}' "$1" 2>/dev/null || true; }
size() { docker image inspect -f '{{.Size}}' "$1" | numfmt --to=iec; }

# The bare node (no venv): for BAKE_VENV=0, and the start of a baked one.
build_bare() {
    local target="$1" inputs
    inputs="$(
        {
            echo "base $(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || echo "$BASE_IMAGE")"
            sha256sum Dockerfile docker/* trainer/requirements*.txt
        } | sha256sum | cut -c1-32
    )"
    if [ "$(label "$target")" = "$inputs" ] && [ "${FORCE:-0}" != 1 ]; then
        echo "build-node-image: $target is up to date"
        return
    fi
    echo "build-node-image: building $target (base $BASE_IMAGE)"
    docker build -q --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg BAKE_VENV=0 \
        --build-arg WHEELHOUSE=.cache/no-wheelhouse --label tfcluster.inputs="$inputs" \
        -t "$target" . >/dev/null
    echo "build-node-image: built $target ($(size "$target"))"
}

if [ "$bake" != 1 ]; then
    build_bare "$image"
    exit 0
fi

bash docker/build-wheelhouse.sh .cache/wheelhouse
# The same fingerprint infra/setup/install.py computes (InstallPlan.fingerprint): baked nodes are "already installed".
marker="$("$python" -m tfcluster_cli.compose marker --config "$config")"
remote_dir="$("$python" -c 'import sys; from infra.config.loader import load_config
print(load_config(sys.argv[1]).setup.remote_dir)' "$config")"

if [ "$method" = build ]; then
    inputs="$(
        {
            echo "build base $(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" 2>/dev/null)"
            echo "marker $marker dir $remote_dir"
            sha256sum Dockerfile docker/* trainer/requirements*.txt
            wheels
        } | sha256sum | cut -c1-32
    )"
    if [ "$(label "$image")" = "$inputs" ] && [ "${FORCE:-0}" != 1 ]; then
        echo "build-node-image: $image is up to date"
        exit 0
    fi
    echo "build-node-image: building $image (docker build, BAKE_VENV=1)"
    docker build -q --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg BAKE_VENV=1 \
        --build-arg INSTALL_MARKER="$marker" --build-arg REMOTE_DIR="$remote_dir" \
        --label tfcluster.inputs="$inputs" -t "$image" . >/dev/null
    echo "build-node-image: built $image ($(size "$image"))"
    exit 0
fi

build_bare "$bare"
inputs="$(
    {
        echo "commit bare $(docker image inspect -f '{{.Id}}' "$bare")"
        echo "marker $marker dir $remote_dir"
        sha256sum trainer/requirements*.txt docker/bake-venv.sh
        wheels
    } | sha256sum | cut -c1-32
)"
if [ "$(label "$image")" = "$inputs" ] && [ "${FORCE:-0}" != 1 ]; then
    echo "build-node-image: $image is up to date"
    exit 0
fi
echo "build-node-image: baking the venv into $image (about a minute)"
baker="tfcluster-bake-$$"
trap 'docker rm -f "$baker" >/dev/null 2>&1 || true' EXIT
docker run --name "$baker" -u tfcluster --entrypoint tfcluster-bake \
    -v "$PWD/.cache/wheelhouse:/tmp/wheelhouse:ro" \
    -v "$PWD/trainer/requirements.txt:/tmp/requirements.txt:ro" \
    -v "$PWD/trainer/requirements-no-deps.txt:/tmp/requirements-no-deps.txt:ro" \
    "$bare" /tmp/wheelhouse /tmp/requirements.txt "$remote_dir" "$marker"
# The container's config (user, entrypoint) back to the bare image's.
docker commit \
    --change 'USER root' \
    --change 'ENTRYPOINT ["/usr/local/sbin/tfcluster-entrypoint"]' \
    --change 'CMD []' \
    --change "LABEL tfcluster.inputs=$inputs" \
    "$baker" "$image" >/dev/null
echo "build-node-image: built $image ($(size "$image"))"
