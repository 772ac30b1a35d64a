#!/usr/bin/env bash
# Brings up a real two-node Kubernetes 1.20 cluster on this machine:
# etcd, kube-apiserver (RBAC), controller-manager, scheduler, cluster DNS
# (dnsmasq fed from the API server), and two nodes, each with containerd + runc,
# a bridge CNI, a kubelet and kube-proxy: node 1 (on-demand) in the host's
# namespaces, node 2 (spot) in its own (node2.sh). Writes $STATE/kubeconfig.
#
# With KUBECONFIG already pointing at a reachable cluster (kind in CI, say) and
# TRAINYARD_E2E_EXISTING=1, it builds and starts nothing.
#
# Idempotent: components already running (PID file alive) are left alone.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=env.sh
source "$HERE/env.sh"
# shellcheck source=pki.sh
source "$HERE/pki.sh"

if [[ ${TRAINYARD_E2E_EXISTING:-0} == 1 ]]; then
  : "${KUBECONFIG:?TRAINYARD_E2E_EXISTING=1 needs KUBECONFIG}"
  "$K8S_BIN/kubectl" version >/dev/null 2>&1 || kubectl version
  echo "up: using existing cluster from KUBECONFIG=$KUBECONFIG"
  exit 0
fi

[[ $(id -u) == 0 ]] || { echo "up: must run as root (containerd, kubelet, netns)" >&2; exit 1; }
"$HERE/install-prereqs.sh"
"$HERE/build-k8s.sh"

# State left by a session that ended without down.sh (nothing of it alive):
# clear it so stale etcd objects and mounts don't leak into this cluster.
if [[ -d $PIDS ]]; then
  any_alive=0
  for f in "$PIDS"/*.pid; do
    [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && any_alive=1
  done
  if [[ $any_alive == 0 ]]; then
    echo "up: clearing stale state in $STATE"
    bash "$HERE/down.sh"
  fi
fi

mkdir -p "$STATE" "$LOGS" "$PIDS" "$STATE/pki" "$STATE/etcd" "$STATE/cni/net.d" \
  "$STATE/containerd" "$STATE/fake-gpus" "$KUBELET_ROOT" /var/log/pods

alive() { [[ -f $PIDS/$1.pid ]] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

# start NAME CMD...: runs CMD in the background with its own PID recorded
# (exec, so the PID is the program's, not a wrapping shell's).
start() {
  local name=$1; shift
  if alive "$name"; then echo "up: $name already running (pid $(cat "$PIDS/$name.pid"))"; return; fi
  setsid bash -c 'exec "$@"' _ "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name.pid"
  echo "up: started $name (pid $!)"
}

wait_for() { # wait_for DESC TIMEOUT CMD...
  local desc=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then echo "up: timed out waiting for $desc; see $LOGS" >&2; exit 1; fi
    sleep 0.5
  done
}

# ---------- PKI (one CA; client certs by role) ----------
pki=$STATE/pki
make_pki "$pki" trainyard-e2e-ca trainyard-admin \
  "IP:127.0.0.1,IP:$BRIDGE_IP,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
  kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "IP:127.0.0.1,IP:$NODE1_IP,DNS:$NODE_NAME" \
  kube-proxy "/CN=system:kube-proxy" "" \
  apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" ""

kubeconfig() { # kubeconfig FILE CERTNAME
  write_kubeconfig "$1" trainyard-e2e "https://127.0.0.1:$APISERVER_PORT" "$pki" "$2"
}
kubeconfig "$KUBECONFIG_FILE" admin
kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager
kubeconfig "$STATE/scheduler.kubeconfig" scheduler
kubeconfig "$STATE/kubelet.kubeconfig" kubelet
kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE")

# ---------- pod network bridge (created here so down.sh owns it) ----------
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
  ip addr add "$BRIDGE_IP/16" dev "$BRIDGE"
fi
ip link set "$BRIDGE" up
# No masquerading and no default route: pods reach each other (both nodes' subnets), the
# Services and the host, and nothing off the machine.
# What down.sh puts back: forwarding, and the packet filter the kubelets and kube-proxy extend.
if [[ ! -f $STATE/ip_forward.orig ]]; then
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward.orig"
  iptables-save >"$STATE/iptables.orig"
  ip6tables-save >"$STATE/ip6tables.orig" 2>/dev/null || true
fi
sysctl -qw net.ipv4.ip_forward=1
write_cni_conflist "$STATE/cni/net.d/10-trainyard.conflist" trainyard-e2e "$BRIDGE" false \
  "$POD_SUBNET" 10.88.1.1 "$BRIDGE_IP" "$STATE/cni/ipam"

# ---------- etcd ----------
flags=() # set by the *_flags functions of pki.sh
etcd_flags flags trainyard-e2e "$STATE/etcd" "$ETCD_PORT" "$ETCD_PEER_PORT"
start etcd /usr/bin/etcd "${flags[@]}"
wait_for etcd 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ETCD_PORT"

# ---------- kube-apiserver ----------
apiserver_flags flags "$pki" "$ETCD_PORT" "$APISERVER_PORT" "$BRIDGE_IP" "$SERVICE_CIDR" \
  apiserver-kubelet-client
start kube-apiserver "$K8S_BIN/kube-apiserver" "${flags[@]}"
wait_for kube-apiserver 90 "${KUBECTL[@]}" get --raw /readyz

# Pods (and node 2) reach the API server at $BRIDGE_IP:$APISERVER_PORT: forwarded to
# loopback by trainyard-api-delay, which holds every byte back for the milliseconds in
# $API_DELAY_FILE (0: none; the chaos run's ApiLatency fault and the latency rows of the
# hard-loss table write it).
API_DELAY=${CARGO_TARGET_DIR:-$ROOT/target}/debug/trainyard-api-delay
if [[ ! -x $API_DELAY ]]; then
  (cd "$ROOT" && cargo build -q -p trainyard-e2e --bin trainyard-api-delay)
fi
alive apiserver-bridge-proxy || echo 0 >"$API_DELAY_FILE"
start apiserver-bridge-proxy "$API_DELAY" \
  "$BRIDGE_IP:$APISERVER_PORT" "127.0.0.1:$APISERVER_PORT" "$API_DELAY_FILE"

# ---------- controller-manager and scheduler ----------
# A short grace period before a silent node is NotReady, so that the tests of NotReady do not
# wait; TRAINYARD_DEFAULT_TIMERS=1 keeps the default (40s on 1.20) to measure a loss as
# production sees it. Recorded for make demo's output.
if [[ -n ${TRAINYARD_DEFAULT_TIMERS:-} ]]; then
  grace='' grace_said="40s (default)"
else
  grace=15s grace_said=15s
fi
alive kube-controller-manager || echo "$grace_said" >"$STATE/node-monitor-grace-period"
controller_manager_flags flags "$STATE/controller-manager.kubeconfig" 10257 "$pki" "$grace"
start kube-controller-manager "$K8S_BIN/kube-controller-manager" "${flags[@]}"
scheduler_flags flags "$STATE/scheduler.kubeconfig" 10259
start kube-scheduler "$K8S_BIN/kube-scheduler" "${flags[@]}"

# ---------- containerd ----------
cat >"$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/trainyard/pause:dev"
  # The sandbox lacks CAP_SYS_RESOURCE: without this runc fails with
  # "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
start containerd /usr/bin/containerd --config "$STATE/containerd/config.toml"
wait_for containerd 30 test -S "$CONTAINERD_SOCK"

"$HERE/images.sh" pause

# ---------- kubelet ----------
cat >"$STATE/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE1_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failSwapOn: false
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
maxPods: 250
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
# ConfigMap volumes (the fake GPU file) refresh within seconds.
syncFrequency: 5s
clusterDNS: [$CLUSTER_DNS_IP]
clusterDomain: $CLUSTER_DOMAIN
EOF
start kubelet "$K8S_BIN/kubelet" \
  --config "$STATE/kubelet-config.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
  --root-dir "$KUBELET_ROOT" --hostname-override "$NODE_NAME" --node-ip "$NODE1_IP" \
  --node-labels "$SPOT_LABEL=on-demand" \
  --container-runtime remote --container-runtime-endpoint "unix://$CONTAINERD_SOCK" \
  --runtime-request-timeout 5m --pod-infra-container-image docker.io/trainyard/pause:dev \
  --cgroups-per-qos=false --enforce-node-allocatable= --v 1
wait_for "node $NODE_NAME Ready" 120 bash -c \
  "'${KUBECTL[0]}' --kubeconfig '$KUBECONFIG_FILE' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"

start kube-proxy "$K8S_BIN/kube-proxy" "${KUBE_PROXY_FLAGS[@]}" \
  --kubeconfig "$STATE/kube-proxy.kubeconfig" --hostname-override "$NODE_NAME"

# ---------- cluster DNS: dnsmasq answers $CLUSTER_DOMAIN from a hosts file that
# trainyard-cluster-dns keeps in step with the API server's Services and Endpoints ----------
DNS_FEEDER=${CARGO_TARGET_DIR:-$ROOT/target}/debug/trainyard-cluster-dns
if [[ ! -x $DNS_FEEDER ]]; then
  (cd "$ROOT" && cargo build -q -p trainyard-e2e --bin trainyard-cluster-dns)
fi
mkdir -p "$STATE/dns/hosts"
start cluster-dns env KUBECONFIG="$KUBECONFIG_FILE" "$DNS_FEEDER" "$STATE/dns/hosts" "$CLUSTER_DOMAIN"
# No upstream servers: names outside the cluster domain are refused, nothing leaves the machine.
# (dnsmasq takes its options' values after '=' only.)
start dnsmasq /usr/sbin/dnsmasq --keep-in-foreground --no-resolv --no-hosts --no-poll \
  --listen-address="$CLUSTER_DNS_IP" --bind-interfaces --port=53 \
  --local="/$CLUSTER_DOMAIN/" --hostsdir="$STATE/dns/hosts" --user=root \
  --pid-file="$STATE/dns/dnsmasq.pid" --log-facility=- --log-queries
wait_for "cluster DNS" 30 bash -c "exec 3<>/dev/tcp/$CLUSTER_DNS_IP/53"

# ---------- node 2, the spot node ----------
bash "$HERE/node2.sh" start

# Default StorageClass on the in-tree hostPath provisioner (ReadWriteOnce only).
"${KUBECTL[@]}" apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
EOF
wait_for "default service account" 60 "${KUBECTL[@]}" -n default get serviceaccount default

echo "up: cluster ready. export KUBECONFIG=$KUBECONFIG_FILE"
