#!/usr/bin/env bash
# Stops exactly what up.sh started (by PID), the containers containerd ran for
# it, unmounts the kubelet's and containerd's mounts, removes the pod network
# namespaces and the bridge, then deletes the cluster state
# (TRAINYARD_E2E_KEEP=1 keeps $STATE, logs included).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
source "$HERE/env.sh"

[[ ${TRAINYARD_E2E_EXISTING:-0} == 1 ]] && { echo "down: existing cluster, nothing to stop"; exit 0; }

# Pod network namespaces of a run that ended without down.sh (its containerd is gone, so the
# loop above cannot name them): CNI's, holding an address of this harness's pod subnets.
in_pod_subnet() { python3 -c 'import ipaddress,sys
a = ipaddress.ip_interface(sys.argv[1]).ip
sys.exit(0 if any(a in ipaddress.ip_network(n) for n in sys.argv[2:]) else 1)' "$@"; }
sweep_stale_netns() {
  for ns in /run/netns/cni-*; do
    [[ -e $ns ]] || continue
    name=$(basename "$ns")
    addr=$(ip netns exec "$name" ip -4 -o addr show dev eth0 2>/dev/null | awk '{print $4; exit}')
    [[ -n $addr ]] && in_pod_subnet "$addr" "$POD_SUBNET" "$NODE2_POD_SUBNET" || continue
    ip netns delete "$name" 2>/dev/null && echo "down: removed stale pod network namespace $name ($addr)"
  done
  # `ip netns add` (node 2) and the CNI plugins make /run/netns a mount point; drop it once empty.
  if findmnt -rn /run/netns >/dev/null && [[ -z $(ls -A /run/netns 2>/dev/null) ]]; then
    umount /run/netns 2>/dev/null && echo "down: unmounted /run/netns"
  fi
}

[[ -d $STATE ]] || { sweep_stale_netns; echo "down: nothing else to do ($STATE absent)"; exit 0; }

stop() { # stop NAME: SIGTERM, wait up to 10 s, then SIGKILL
  local f=$PIDS/$1.pid pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    echo "down: stopped $1 (pid $pid)"
  fi
  rm -f "$f"
}

# The hostPath provisioner's volumes (/tmp/hostpath_pv/<id>, outside $STATE): every PV that
# names one goes with the cluster state, so they go too (a retained checkpoint claim's stayed).
pv_dirs=()
if [[ ${TRAINYARD_E2E_KEEP:-0} != 1 ]]; then
  mapfile -t pv_dirs < <("$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout 10s get pv \
    -o jsonpath='{range .items[*]}{.spec.hostPath.path}{"\n"}{end}' 2>/dev/null |
    grep -E '^/tmp/hostpath_pv/[0-9a-f-]+$')
fi

# The spot node first: its processes, namespaces, veth, route and cgroups.
bash "$HERE/node2.sh" stop

stop kubelet
stop kube-proxy

# Containers: kill every task containerd runs for the cluster and remember
# their network namespaces, so we remove exactly the ones it created for us.
CTR=(/usr/bin/ctr --address "$CONTAINERD_SOCK" -n k8s.io)
netns=()
if [[ -S $CONTAINERD_SOCK ]] && [[ -f $PIDS/containerd.pid ]] && kill -0 "$(cat "$PIDS/containerd.pid")" 2>/dev/null; then
  mapfile -t tasks < <("${CTR[@]}" tasks ls -q 2>/dev/null)
  for t in "${tasks[@]}"; do
    ns=$("${CTR[@]}" containers info "$t" 2>/dev/null |
      python3 -c 'import json,sys
try:
    spec = json.load(sys.stdin)["Spec"]
    print(next(n.get("path", "") for n in spec["linux"]["namespaces"] if n["type"] == "network"))
except Exception:
    pass' 2>/dev/null)
    [[ $ns == /var/run/netns/* || $ns == /run/netns/* ]] && netns+=("$ns")
    "${CTR[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1
  done
  for t in "${tasks[@]}"; do
    for _ in $(seq 1 20); do
      "${CTR[@]}" tasks delete "$t" >/dev/null 2>&1 && break
      sleep 0.25
    done
  done
  ((${#tasks[@]})) && echo "down: killed ${#tasks[@]} container(s)"
fi

for name in prometheus prometheus-sd dnsmasq cluster-dns kube-scheduler kube-controller-manager apiserver-bridge-proxy kube-apiserver containerd etcd; do
  stop "$name"
done

# Shims of our containerd that outlived it (a session that ended without
# down.sh): each names our socket in its -address argument. Kill its
# children (the containers) and then the shim, by PID.
for cmdline in /proc/[0-9]*/cmdline; do
  pid=${cmdline#/proc/}; pid=${pid%/cmdline}
  args=$(tr '\0' ' ' <"$cmdline" 2>/dev/null) || continue
  [[ $args == *containerd-shim* && $args == *"-address $CONTAINERD_SOCK"* ]] || continue
  for child in $(cat /proc/"$pid"/task/*/children 2>/dev/null); do kill -9 "$child" 2>/dev/null; done
  kill -9 "$pid" 2>/dev/null && echo "down: killed orphaned shim $pid"
done

# Mounts under the kubelet root and the containerd state, deepest first.
unmount_under() {
  local prefix=$1
  findmnt -rn -o TARGET | grep -E "^${prefix}(/|$)" | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
}
unmount_under "$KUBELET_ROOT"
unmount_under "$STATE"

for ns in $(printf '%s\n' "${netns[@]}" | sort -u); do
  name=$(basename "$ns")
  ip netns delete "$name" 2>/dev/null || { umount "$ns" 2>/dev/null; rm -f "$ns"; }
done
((${#netns[@]})) && echo "down: removed pod network namespaces"
sweep_stale_netns

if ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link delete "$BRIDGE" && echo "down: removed bridge $BRIDGE"
fi

# The packet filter and forwarding as up.sh found them (kube-proxy's and the kubelet's chains go).
if [[ -f $STATE/ip_forward.orig ]]; then
  sysctl -qw net.ipv4.ip_forward="$(cat "$STATE/ip_forward.orig")"
  iptables-restore <"$STATE/iptables.orig" && echo "down: restored iptables"
  [[ -s $STATE/ip6tables.orig ]] && ip6tables-restore <"$STATE/ip6tables.orig"
  # iptables-restore rewrites only the tables the saved file names: on a fresh machine the
  # file is empty, and the tables kube-proxy and the kubelet created are emptied here instead.
  for table in filter nat mangle raw; do
    grep -q "^\*$table\$" "$STATE/iptables.orig" && continue
    iptables -t "$table" -F 2>/dev/null && iptables -t "$table" -X 2>/dev/null
  done
fi
# containerd's cgroup parent, once its containers' cgroups are gone (every v1 hierarchy, or v2's).
for h in $(cgroup_hierarchies); do rmdir "$h/k8s.io" 2>/dev/null; done

if [[ -n ${TRAINYARD_E2E_LOGS_TO:-} ]]; then
  # Keep the component and pod logs for after the state is gone (CI artefacts).
  rm -rf "$TRAINYARD_E2E_LOGS_TO"; mkdir -p "$TRAINYARD_E2E_LOGS_TO"
  cp -r "$LOGS" "$TRAINYARD_E2E_LOGS_TO/components" 2>/dev/null
  cp -r /var/log/pods "$TRAINYARD_E2E_LOGS_TO/pods" 2>/dev/null
  cp -r "$NODE2_DIR/private/var/log/pods" "$TRAINYARD_E2E_LOGS_TO/pods-node2" 2>/dev/null
  # Every container's log the run saw, replaced and deleted pods included (keep-logs.sh).
  cp -r "$STATE/kept-pods" "$TRAINYARD_E2E_LOGS_TO/all-pods" 2>/dev/null
  echo "down: logs copied to $TRAINYARD_E2E_LOGS_TO"
fi

# KUBE-* chains the host had before up.sh are not ours.
host_had_kube_chains=0
grep -q '^:KUBE-' "$STATE/iptables.orig" 2>/dev/null && host_had_kube_chains=1
if [[ ${TRAINYARD_E2E_KEEP:-0} != 1 ]]; then
  rm -rf "$STATE"
  rm -rf /var/log/pods/*
  # Only the kubelet's own tree; the harness chose this root for its kubelet.
  rm -rf "${KUBELET_ROOT:?}/pods" "${KUBELET_ROOT:?}/plugins" "${KUBELET_ROOT:?}/plugins_registry" \
    "${KUBELET_ROOT:?}/device-plugins" "${KUBELET_ROOT:?}/pod-resources" "${KUBELET_ROOT:?}/cpu_manager_state" \
    "${KUBELET_ROOT:?}/memory_manager_state"
  echo "down: removed $STATE"
  if ((${#pv_dirs[@]})); then
    rm -rf "${pv_dirs[@]}" && echo "down: removed ${#pv_dirs[@]} hostPath volume(s) under /tmp/hostpath_pv"
  fi
fi

# Check, don't assume: nothing the harness made may outlive it. Exit 1 (make test fails)
# when anything is left, naming it.
leftovers=()
for _ in $(seq 1 20); do # killed processes may take a moment to be reaped
  leftovers=()
  for cmdline in /proc/[0-9]*/cmdline; do
    pid=${cmdline#/proc/}; pid=${pid%/cmdline}
    [[ $pid == "$$" ]] && continue
    args=$(tr '\0' ' ' <"$cmdline" 2>/dev/null) || continue
    [[ $args == *"$STATE"* && $args != *down.sh* && $args != *with-cluster.sh* ]] &&
      leftovers+=("process $pid: ${args:0:120}")
  done
  ((${#leftovers[@]})) || break
  sleep 0.25
done
ip netns list 2>/dev/null | grep -qw "^$NODE2_NETNS" && leftovers+=("network namespace $NODE2_NETNS")
for ns in /run/netns/cni-*; do
  [[ -e $ns ]] || continue
  addr=$(ip netns exec "$(basename "$ns")" ip -4 -o addr show dev eth0 2>/dev/null | awk '{print $4; exit}')
  [[ -n $addr ]] && in_pod_subnet "$addr" "$POD_SUBNET" "$NODE2_POD_SUBNET" &&
    leftovers+=("network namespace $(basename "$ns") ($addr)")
done
for link in "$BRIDGE" "$NODE2_VETH_HOST"; do
  ip link show "$link" >/dev/null 2>&1 && leftovers+=("link $link")
done
while read -r route; do
  [[ -n $route ]] && leftovers+=("route $route")
done < <(ip route show | grep -E "^($NODE2_POD_SUBNET|${SERVICE_CIDR}) |via $NODE2_IP ")
while read -r m; do
  [[ -n $m ]] && leftovers+=("mount $m")
done < <(findmnt -rn -o TARGET | grep -E "^($STATE|${KUBELET_ROOT}/pods)(/|$)")
if ((!host_had_kube_chains)) && iptables-save 2>/dev/null | grep -q '^:KUBE-'; then
  leftovers+=("iptables KUBE-* chains")
fi
# Node 2's cgroup in every hierarchy (cgroup v1) or the unified tree (v2), and, on v2 where a
# freeze is per cgroup, any of containerd's container cgroups still frozen.
for h in $(cgroup_hierarchies); do
  [[ -d $h/$NODE2_CGROUP ]] && leftovers+=("cgroup $h/$NODE2_CGROUP")
done
if ((CGROUP_V2)); then
  for cg in /sys/fs/cgroup/k8s.io/*/; do
    grep -qx 'frozen 1' "$cg/cgroup.events" 2>/dev/null && leftovers+=("frozen cgroup ${cg%/}")
  done
fi
if ((${#leftovers[@]})); then
  echo "down: LEFT BEHIND (${#leftovers[@]}):" >&2
  printf '  %s\n' "${leftovers[@]}" >&2
  exit 1
fi
echo "down: done; verified that no process, network namespace, link, route, mount, KUBE-* chain or node cgroup of the harness is left"
