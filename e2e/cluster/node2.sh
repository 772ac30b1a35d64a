#!/usr/bin/env bash
# The local cluster's second node, the spot node ($NODE2_NAME): its own containerd, kubelet
# and kube-proxy in their own network namespace, mount namespace and cgroup subtree.
#
#   node2.sh start   create what is missing and start the node (idempotent); waits for Ready
#   node2.sh lose    lose the node the way a reclaimed spot VM disappears: its kubelet,
#                    containerd, kube-proxy, shims and containers are all killed at once
#                    (SIGKILL, frozen first so that nothing runs in between; the cgroup v1
#                    freezer, or cgroup.freeze and cgroup.kill on cgroup v2); the Node object
#                    and the namespaces stay, as the VM's address would. `start` brings it back.
#   node2.sh partition  take the node's link down with every process of it alive (a network
#                    partition: it can reach nothing, nothing can reach it); `heal` undoes it
#   node2.sh stop    lose it, then remove its mounts, namespaces, veth, routes and cgroups
#                    (down.sh calls this)
#
# Called by up.sh and down.sh; tests and the demo call `lose` and `start`, the chaos run
# also `partition` and `heal`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
source "$HERE/env.sh"

PRIVATE=$NODE2_DIR/private
# The node's own cgroup (env.sh: the v1 freezer hierarchy or the v2 tree).
NODE_CG=$NODE2_CGROUP_DIR
N2PIDS=$PIDS/node2
mkdir -p "$N2PIDS" "$LOGS"

log() { echo "node2: $*"; }
in_node() { nsenter --net="/run/netns/$NODE2_NETNS" --mount="$NODE2_MNTNS" -- "$@"; }
alive() { [[ -f $N2PIDS/$1.pid ]] && kill -0 "$(cat "$N2PIDS/$1.pid")" 2>/dev/null; }

# start_in_node NAME CMD...: runs CMD inside the node's namespaces and cgroup, its own PID
# recorded (setsid, nsenter and bash all exec, so $! is the program's PID).
start_in_node() {
  local name=$1; shift
  if alive "$name"; then log "$name already running (pid $(cat "$N2PIDS/$name.pid"))"; return; fi
  setsid nsenter --net="/run/netns/$NODE2_NETNS" --mount="$NODE2_MNTNS" -- \
    bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$NODE_CG/system" "$@" \
    >>"$LOGS/node2-$name.log" 2>&1 </dev/null &
  echo $! >"$N2PIDS/$name.pid"
  log "started $name (pid $!)"
}

wait_for() { # wait_for DESC TIMEOUT CMD...
  local desc=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then log "timed out waiting for $desc; see $LOGS/node2-*.log" >&2; exit 1; fi
    sleep 0.5
  done
}

# ---------- namespaces, network and cgroups (each step only if missing) ----------
make_namespaces() {
  mkdir -p "$NODE2_DIR" "$(dirname "$NODE2_MNTNS")"
  if ! ip netns list | grep -qw "^$NODE2_NETNS"; then
    ip netns add "$NODE2_NETNS"
    ip link add "$NODE2_VETH_HOST" type veth peer name eth0 netns "$NODE2_NETNS"
    ip addr add "$NODE2_HOST_IP/30" dev "$NODE2_VETH_HOST"
    ip link set "$NODE2_VETH_HOST" up
    ip netns exec "$NODE2_NETNS" ip addr add "$NODE2_IP/30" dev eth0
    ip netns exec "$NODE2_NETNS" ip link set eth0 up
    ip netns exec "$NODE2_NETNS" ip link set lo up
    # Only the cluster's own ranges are routed: nothing leaves the machine.
    ip netns exec "$NODE2_NETNS" ip route add 10.88.0.0/16 via "$NODE2_HOST_IP"
    ip route replace "$NODE2_POD_SUBNET" via "$NODE2_IP" dev "$NODE2_VETH_HOST"
    ip netns exec "$NODE2_NETNS" sysctl -qw net.ipv4.ip_forward=1
    log "network namespace $NODE2_NETNS: $NODE2_IP, pods $NODE2_POD_SUBNET"
  fi
  # A persistent mount namespace: bind-mounted on a file under a private mount point.
  if ! findmnt -rn "$(dirname "$NODE2_MNTNS")" >/dev/null; then
    mount --bind "$(dirname "$NODE2_MNTNS")" "$(dirname "$NODE2_MNTNS")"
    mount --make-private "$(dirname "$NODE2_MNTNS")"
  fi
  if ! findmnt -rn "$NODE2_MNTNS" >/dev/null; then
    touch "$NODE2_MNTNS"
    unshare --mount="$NODE2_MNTNS" --propagation private true
    for d in "${NODE2_PRIVATE_DIRS[@]}"; do
      mkdir -p "$d" "$PRIVATE$d"
      nsenter --mount="$NODE2_MNTNS" -- mount --bind "$PRIVATE$d" "$d"
    done
    log "mount namespace $NODE2_MNTNS: private ${NODE2_PRIVATE_DIRS[*]}"
  fi
  mkdir -p "$NODE_CG/system"
}

# ---------- PKI and kubeconfigs (the CA is up.sh's) ----------
make_credentials() {
  local pki=$STATE/pki
  if [[ ! -f $pki/kubelet-node2.crt ]]; then
    (
      cd "$pki"
      openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$NODE2_NAME" \
        -keyout kubelet-node2.key -out kubelet-node2.csr 2>/dev/null
      printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:%s,IP:127.0.0.1,DNS:%s\n' \
        "$NODE2_IP" "$NODE2_NAME" >kubelet-node2.ext
      openssl x509 -req -in kubelet-node2.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile kubelet-node2.ext -out kubelet-node2.crt 2>/dev/null
    )
  fi
  # Node 2 reaches the API server on the host side of the pod bridge.
  sed -e "s#https://127.0.0.1:$APISERVER_PORT#https://$BRIDGE_IP:$APISERVER_PORT#" \
      -e "s#$pki/kubelet\.#$pki/kubelet-node2.#g" \
      "$STATE/kubelet.kubeconfig" >"$NODE2_DIR/kubelet.kubeconfig"
  sed -e "s#https://127.0.0.1:$APISERVER_PORT#https://$BRIDGE_IP:$APISERVER_PORT#" \
      "$STATE/kube-proxy.kubeconfig" >"$NODE2_DIR/kube-proxy.kubeconfig"
}

# The node's kubelet, in its namespaces and cgroup.
start_kubelet() {
  start_in_node kubelet "$K8S_BIN/kubelet" \
    --config "$NODE2_DIR/kubelet-config.yaml" --kubeconfig "$NODE2_DIR/kubelet.kubeconfig" \
    --root-dir "$NODE2_KUBELET_ROOT" --hostname-override "$NODE2_NAME" --node-ip "$NODE2_IP" \
    --container-runtime remote --container-runtime-endpoint "unix://$NODE2_CONTAINERD_SOCK" \
    --runtime-request-timeout 5m --pod-infra-container-image docker.io/trainyard/pause:dev \
    --cgroups-per-qos=false --enforce-node-allocatable= \
    --node-labels "$SPOT_LABEL=spot" --v 1
}

# The kubelet stopped (SIGTERM, SIGKILL after 30 s) and started again, the node's
# containers left running, as a kubelet upgrade or crash does.
restart_kubelet() {
  alive kubelet || { log "no kubelet running"; return 1; }
  local pid
  pid=$(cat "$N2PIDS/kubelet.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$N2PIDS/kubelet.pid"
  start_kubelet
}

start_node() {
  [[ -f $STATE/pki/ca.crt ]] || { log "the control plane is not up (run up.sh)" >&2; exit 1; }
  make_namespaces
  make_credentials
  mkdir -p "$NODE2_DIR/cni/net.d" "$NODE2_DIR/containerd" "$NODE2_KUBELET_ROOT"
  # The node's own fake GPUs, where the chart's fakeGpus.hostDirectory points on this node.
  local gpus=$PRIVATE$STATE/fake-gpus/fake-gpus.yaml
  [[ -f $gpus ]] || cp "$HERE/fake-gpus-node2.yaml" "$gpus"

  write_cni_conflist "$NODE2_DIR/cni/net.d/10-trainyard.conflist" trainyard-e2e-node2 "$NODE2_BRIDGE" true \
    "$NODE2_POD_SUBNET" 10.90.1.1 "$NODE2_BRIDGE_IP" "$NODE2_DIR/cni/ipam"
  sed -e "s#^root = .*#root = \"$NODE2_DIR/containerd/root\"#" \
      -e "s#^state = .*#state = \"$NODE2_DIR/containerd/state\"#" \
      -e "s#address = \"$CONTAINERD_SOCK\"#address = \"$NODE2_CONTAINERD_SOCK\"#" \
      -e "s#conf_dir = .*#conf_dir = \"$NODE2_DIR/cni/net.d\"#" \
      "$STATE/containerd/config.toml" >"$NODE2_DIR/containerd/config.toml"
  # A lost node leaves its socket behind: wait for a containerd that answers.
  alive containerd || rm -f "$NODE2_CONTAINERD_SOCK"
  start_in_node containerd /usr/bin/containerd --config "$NODE2_DIR/containerd/config.toml"
  wait_for "node 2's containerd" 30 /usr/bin/ctr --address "$NODE2_CONTAINERD_SOCK" version
  # The sandbox image up.sh built (images.sh imports every later image into both nodes).
  /usr/bin/ctr --address "$NODE2_CONTAINERD_SOCK" -n k8s.io images import "$STATE/images/pause.tar" >/dev/null

  sed -e "s#^address: .*#address: $NODE2_IP#" \
      -e "s#$STATE/pki/kubelet\.#$STATE/pki/kubelet-node2.#g" \
      "$STATE/kubelet-config.yaml" >"$NODE2_DIR/kubelet-config.yaml"
  start_kubelet
  start_in_node kube-proxy "$K8S_BIN/kube-proxy" "${KUBE_PROXY_FLAGS[@]}" \
    --kubeconfig "$NODE2_DIR/kube-proxy.kubeconfig" --hostname-override "$NODE2_NAME"
  wait_for "node $NODE2_NAME Ready" 120 bash -c \
    "'$K8S_BIN/kubectl' --kubeconfig '$KUBECONFIG_FILE' get node '$NODE2_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  log "$NODE2_NAME Ready"
}

# The node's cgroups: its own subtree (kubelet, containerd, kube-proxy and the shims containerd
# forks) and the one runc made for each container of its containerd (the kubelet hands
# containerd no cgroup parent without QoS cgroups, so those sit under /k8s.io/<id>, beside
# node 1's; see docs/e2e.md). On v1 these are the freezer hierarchy's, on v2 the one tree's.
node_cgroups() {
  [[ -d $NODE_CG ]] && find "$NODE_CG" -mindepth 1 -type d
  if [[ -S $NODE2_CONTAINERD_SOCK ]]; then
    local id
    for id in $(timeout 5 /usr/bin/ctr --address "$NODE2_CONTAINERD_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      [[ -d $CGROUP_FS/k8s.io/$id ]] && echo "$CGROUP_FS/k8s.io/$id"
    done
  fi
  return 0
}

pids_of() { # pids_of CGROUP...: the processes of exactly these cgroups (v2: not descendants)
  local cg
  for cg in "$@"; do cat "$cg/cgroup.procs" 2>/dev/null; done | sort -un
}

freeze() { # freeze CGROUP...
  local cg
  for cg in "$@"; do
    # A container's cgroup may go between listing and freezing.
    { if ((CGROUP_V2)); then echo 1 >"$cg/cgroup.freeze"; else echo FROZEN >"$cg/freezer.state"; fi; } 2>/dev/null || true
  done
  ((CGROUP_V2)) || return 0
  # A v2 freeze completes asynchronously: cgroup.events says `frozen 1` once it has.
  local deadline=$((SECONDS + 2))
  for cg in "$@"; do
    until grep -qx 'frozen 1' "$cg/cgroup.events" 2>/dev/null || ! [[ -d $cg ]] || ((SECONDS > deadline)); do
      sleep 0.05
    done
  done
}

thaw() { # thaw CGROUP...: killed processes exit once thawed (v1) or at once (v2)
  local cg
  for cg in "$@"; do
    { if ((CGROUP_V2)); then echo 0 >"$cg/cgroup.freeze"; else echo THAWED >"$cg/freezer.state"; fi; } 2>/dev/null || true
  done
  return 0
}

lose_node() {
  local cgroups pids n cg
  mapfile -t cgroups < <(node_cgroups)
  ((${#cgroups[@]})) || { log "not running"; return 0; }
  # Freeze first, so that no process of the node notices and reacts before all are gone.
  freeze "${cgroups[@]}"
  mapfile -t pids < <(pids_of "${cgroups[@]}")
  n=${#pids[@]}
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  if ((CGROUP_V2)); then
    # cgroup.kill (Linux 5.14+) also takes any process the list above missed.
    for cg in "${cgroups[@]}"; do { [[ -f $cg/cgroup.kill ]] && echo 1 >"$cg/cgroup.kill"; } 2>/dev/null || true; done
  fi
  thaw "${cgroups[@]}"
  local deadline=$((SECONDS + 20))
  while [[ -n $(pids_of "${cgroups[@]}") ]] && ((SECONDS < deadline)); do sleep 0.2; done
  local left
  left=$(pids_of "${cgroups[@]}" | wc -l)
  rm -f "$N2PIDS"/*.pid
  if ((left)); then
    log "lose: $left process(es) of the node still alive after SIGKILL" >&2
    return 1
  fi
  log "lost: killed $n process(es) at once"
}

stop_node() {
  # The containers' cgroups: nobody is left to remove them once their shims are killed.
  local ids h
  mapfile -t ids < <(node_cgroups | grep -o '/k8s\.io/[0-9a-f]*$')
  lose_node || true # what is left, down.sh names
  for id in "${ids[@]}"; do
    for h in $(cgroup_hierarchies); do rmdir "$h$id" 2>/dev/null || true; done
  done
  # The namespaces die with their last process; drop the files that keep them.
  if findmnt -rn "$NODE2_MNTNS" >/dev/null; then umount "$NODE2_MNTNS" && log "removed mount namespace"; fi
  if findmnt -rn "$(dirname "$NODE2_MNTNS")" >/dev/null; then umount "$(dirname "$NODE2_MNTNS")"; fi
  if ip netns list | grep -qw "^$NODE2_NETNS"; then ip netns delete "$NODE2_NETNS" && log "removed network namespace"; fi
  ip route del "$NODE2_POD_SUBNET" 2>/dev/null || true
  ip link delete "$NODE2_VETH_HOST" 2>/dev/null || true
  # The node's cgroups in every hierarchy, deepest first (runc removes its containers' own).
  for h in $(cgroup_hierarchies); do
    [[ -d $h/$NODE2_CGROUP ]] || continue
    find "$h/$NODE2_CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  return 0
}

# A partition: the node's only link goes down, so that nothing reaches it and it reaches
# nothing (the API server, node 1, the other pods), while every process of it keeps running.
partition_node() {
  ip link show "$NODE2_VETH_HOST" >/dev/null 2>&1 || { log "not running"; return 1; }
  ip link set "$NODE2_VETH_HOST" down
  log "partitioned: $NODE2_VETH_HOST down, the node's processes alive"
}

heal_node() {
  ip link show "$NODE2_VETH_HOST" >/dev/null 2>&1 || { log "not running"; return 1; }
  ip link set "$NODE2_VETH_HOST" up
  # The kernel dropped the route to the node's pods with the link.
  ip route replace "$NODE2_POD_SUBNET" via "$NODE2_IP" dev "$NODE2_VETH_HOST"
  log "healed: $NODE2_VETH_HOST up, pods $NODE2_POD_SUBNET routed again"
}

case ${1:-} in
  start) start_node ;;
  lose) lose_node ;;
  partition) partition_node ;;
  heal) heal_node ;;
  stop) stop_node ;;
  restart-kubelet) restart_kubelet ;;
  *) echo "usage: node2.sh start|lose|partition|heal|stop|restart-kubelet" >&2; exit 2 ;;
esac
