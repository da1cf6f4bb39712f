#!/bin/bash
# A node's PID 1: make it look like a freshly booted VM (own host keys,
# the operator's key authorized), then run sshd in the foreground.
set -euo pipefail

user="${NODE_USER:-tfcluster}"
home="$(getent passwd "$user" | cut -d: -f6)"

# Host keys are made on first start, not at build: every node (and every
# re-created container) has its own, as VMs do, so host-key pinning is real.
ssh-keygen -A >/dev/null

# Authorized keys: $AUTHORIZED_KEYS (one or more public key lines) and/or a
# file mounted at /run/tfcluster/authorized_keys. Copied, not bind-mounted,
# so sshd's StrictModes sees the ownership and modes it wants.
keys=""
if [ -n "${AUTHORIZED_KEYS:-}" ]; then
    keys="$AUTHORIZED_KEYS"
fi
if [ -r /run/tfcluster/authorized_keys ]; then
    keys="$keys"$'\n'"$(cat /run/tfcluster/authorized_keys)"
fi
if [ -z "${keys//[[:space:]]/}" ]; then
    echo "entrypoint: no key authorized: set AUTHORIZED_KEYS or mount /run/tfcluster/authorized_keys" >&2
fi
install -d -m 700 -o "$user" -g "$user" "$home/.ssh"
printf '%s\n' "$keys" | sed '/^[[:space:]]*$/d' > "$home/.ssh/authorized_keys"
chown "$user:$user" "$home/.ssh/authorized_keys"
chmod 600 "$home/.ssh/authorized_keys"

mkdir -p /run/sshd
chmod 755 /run/sshd
if [ "$#" -gt 0 ]; then
    exec "$@"
fi
exec /usr/sbin/sshd -D -e
