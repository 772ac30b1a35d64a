#!/usr/bin/env bash
# Installs the Debian packages the local cluster needs (idempotent).
# Run as root. CI calls this from a fresh machine.
set -euo pipefail

pkgs=(golang-go etcd-server containerd runc containernetworking-plugins iproute2 iptables
      conntrack socat ethtool util-linux mount rsync make gcc libc6-dev dpkg-dev curl ca-certificates jq
      openssl busybox-static python3 python3-venv python3-pip
      dnsmasq-base debootstrap python3-matplotlib buildah
      lua5.1 prometheus libfaketime)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-prereqs: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Don't leave a packaged containerd/etcd/prometheus running on its default ports: the harness starts its own.
for svc in containerd etcd prometheus; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done
echo "install-prereqs: ok"
