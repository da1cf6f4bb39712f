# A tfcluster node that looks like a fresh Compute Engine Debian 12 VM: a
# login user with passwordless sudo, key-only sshd, python3 + venv, rsync.
#
#   make cluster-image          # builds it (and the local base image, the wheelhouse)
#
# BASE_IMAGE: any Debian bookworm image: debian:bookworm (the default) or
# python:3.11-slim-bookworm with a registry (the apt-get step below installs
# what they lack); without one, `make cluster-image` passes the image that
# docker/build-base-image.sh makes with debootstrap (which has it all).
#
# BAKE_VENV=1 bakes the trainer's dependencies into the node's venv from the
# host-side wheelhouse (.cache/wheelhouse) and writes the same install marker
# that the install of infra/setup/install.py writes (INSTALL_MARKER, from
# `python -m tfcluster_cli.compose marker`), so `deploy.py up` on fresh nodes finds nothing to install.
# (docker/build-node-image.sh gets the same result faster by running
# docker/bake-venv.sh in a container of the BAKE_VENV=0 image and committing it.)
ARG BASE_IMAGE=debian:bookworm

FROM ${BASE_IMAGE}
ARG NODE_USER=tfcluster
ARG NODE_UID=1000
ENV LANG=C.UTF-8
# Only when the base lacks something (a registry image): the default base has
# it all, so this build needs no network.
RUN set -e; need=""; \
    for p in python3 python3-venv openssh-server rsync sudo ca-certificates procps iproute2; do \
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need="$need $p"; \
    done; \
    if [ -n "$need" ]; then \
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends $need && rm -rf /var/lib/apt/lists/*; \
    fi; \
    rm -f /etc/ssh/ssh_host_*
# The login user, as GCE's guest agent makes it: own group, bash, passwordless
# sudo. Password field '*': no password, yet not "locked" (sshd with UsePAM
# no refuses locked accounts even for key logins).
RUN useradd --create-home --shell /bin/bash --uid ${NODE_UID} --user-group ${NODE_USER} \
    && usermod -p '*' ${NODE_USER} \
    && echo "${NODE_USER} ALL=(ALL) NOPASSWD:ALL" > /etc/sudoers.d/90-${NODE_USER} \
    && chmod 440 /etc/sudoers.d/90-${NODE_USER}
COPY docker/sshd_config /etc/ssh/sshd_config.d/10-tfcluster.conf
COPY docker/entrypoint.sh /usr/local/sbin/tfcluster-entrypoint
COPY docker/bake-venv.sh /usr/local/sbin/tfcluster-bake

# -- optional: the trainer's venv, built from the wheelhouse ------------------
# One stage on purpose: copying a baked venv (1.7 GB) out of a second stage
# costs more build time than the wheelhouse layer (0.3 GB) costs disk.
ARG BAKE_VENV=0
ARG REMOTE_DIR=tfcluster
ARG INSTALL_MARKER=
# Set to a folder that does not exist to leave the wheels out (BAKE_VENV=0).
ARG WHEELHOUSE=.cache/wheelhouse
ENV NODE_USER=${NODE_USER}
# The requirements file plus, when it exists, the wheelhouse's wheels (the
# glob may match nothing: the requirements file keeps the COPY valid).
COPY trainer/requirements.txt trainer/requirements-no-deps.txt ${WHEELHOUSE}* /tmp/bake/
# As the login user, as infra/setup/install.py installs: no chown pass over the venv.
USER ${NODE_USER}
RUN if [ "${BAKE_VENV}" = 1 ]; then \
        tfcluster-bake /tmp/bake /tmp/bake/requirements.txt "${REMOTE_DIR}" "${INSTALL_MARKER}"; \
    fi
USER root
EXPOSE 22
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/sbin/tfcluster-entrypoint"]
