# The local docker-compose cluster (included by the Makefile).
#
#   make wheelhouse     - .cache/wheelhouse: the trainer's wheels for the nodes' Python
#   make cluster-image  - the node image (a fresh Debian VM + baked venv); builds
#                         the local base image with debootstrap unless BASE_IMAGE is set
#   make cluster-up     - start pc-1..pc-4, the cluster key authorized
#   make cluster-down   - remove containers, network, volumes, and the nodes' pinned host keys
#
# Then: $(PY) deploy.py --config examples/compose.yaml up | train | status
# BASE_IMAGE=debian:bookworm make cluster-image   (with a registry)
# BAKE_VENV=0 make cluster-image                  (nodes install at `up`)

COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
CLUSTER_PROJECT ?= tfcluster
CLUSTER_CONFIG ?= examples/compose.yaml
NODE_IMAGE ?= tfcluster/node:local
BAKE_VENV ?= 1
export NODE_IMAGE BAKE_VENV CLUSTER_CONFIG

.PHONY: wheelhouse cluster-image cluster-up cluster-down

wheelhouse: $(STAMP)
	PYTHON=$(PY) bash docker/build-wheelhouse.sh .cache/wheelhouse

cluster-image: $(STAMP)
	PYTHON=$(PY) bash docker/build-node-image.sh

cluster-up: cluster-image
	TFCLUSTER_NODE_IMAGE=$(NODE_IMAGE) \
	TFCLUSTER_AUTHORIZED_KEYS="$$($(PY) -m tfcluster_cli.compose public-key --config $(CLUSTER_CONFIG))" \
		$(COMPOSE) -p $(CLUSTER_PROJECT) -f docker-compose.yml up -d
	@echo "cluster up: $(PY) deploy.py --config $(CLUSTER_CONFIG) up"

cluster-down: $(STAMP)
	TFCLUSTER_AUTHORIZED_KEYS=unused $(COMPOSE) -p $(CLUSTER_PROJECT) -f docker-compose.yml \
		down -v --remove-orphans
	@# The containers are gone for good: their host keys go too, or the next
	@# cluster-up (new containers, new keys) would be refused as "changed".
	$(PY) -m tfcluster_cli.compose forget-host --config $(CLUSTER_CONFIG)
