#!/usr/bin/env bash
# Installs the Debian packages the local cluster needs (idempotent).
# Run as root. CI calls this from a fresh machine.
set -euo pipefail

cat <<'NOTE'
install-prereqs: the local cluster (make demo, make test, make cluster-up) changes this host:
  - installs the Debian packages below (apt-get), and caches Kubernetes 1.20, a PyTorch
    trainer image and a Python venv in ~/.cache/trainyard
  - while it runs: iptables chains (saved first, restored by make cluster-down), the bridges
    tybr0 and tybr1, a veth pair, the network namespace ty-node2 and the cgroup
    trainyard-node2, a route to 10.90.0.0/16, net.ipv4.ip_forward=1 (restored),
    /var/lib/trainyard-e2e (removed), pods under /var/lib/kubelet and checkpoint volumes under /tmp/hostpath_pv
  - its own containerd, etcd (127.0.0.1:12379) and Prometheus (127.0.0.1:19090): services of
    the host are left running; Debian may start its packaged etcd, containerd and prometheus
    on their default socket and ports, which the harness does not use
  make cluster-down stops the cluster and checks that nothing of it is left.
NOTE

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
echo "install-prereqs: ok"
