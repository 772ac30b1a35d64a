# Shared settings of the local cluster harness. Sourced by up.sh, down.sh, images.sh.
# Everything the harness creates lives under $STATE; every process it starts
# has a PID file under $STATE/pids.
CACHE=${TRAINYARD_CACHE:-$HOME/.cache/trainyard}
K8S_BIN=${TRAINYARD_K8S_BIN:-$CACHE/k8s-1.20.2/bin}
STATE=${TRAINYARD_E2E_STATE:-/var/lib/trainyard-e2e}
KUBECONFIG_FILE=$STATE/kubeconfig
NODE_NAME=${TRAINYARD_NODE_NAME:-trainyard-node}
KUBELET_ROOT=${TRAINYARD_KUBELET_ROOT:-/var/lib/kubelet}
ETCD_PORT=12379
ETCD_PEER_PORT=12380
APISERVER_PORT=16443
# Pods reach the API server through the host side of the pod bridge (no kube-proxy).
BRIDGE=tybr0
POD_SUBNET=10.88.0.0/16
BRIDGE_IP=10.88.0.1
# Milliseconds trainyard-api-delay holds the pods' API traffic back (e2e/src/bin/api-delay.rs).
API_DELAY_FILE=$STATE/api-delay-ms
SERVICE_CIDR=10.96.0.0/16
CONTAINERD_SOCK=$STATE/containerd/containerd.sock
LOGS=$STATE/logs
PIDS=$STATE/pids

# ---------- the two nodes ----------
# Node 1 ($NODE_NAME) runs in the host's namespaces and is labelled on-demand. Node 2 is the
# spot node: its kubelet, containerd and kube-proxy run in their own network namespace
# ($NODE2_NETNS, reached over a veth pair), their own mount namespace (so that the kubelet's
# fixed /var/lib/kubelet/device-plugins, /var/log/pods and the fake GPU directory are its
# own) and their own cgroup subtree (/$NODE2_CGROUP), which is how node2.sh loses the node.
NODE1_IP=$BRIDGE_IP
SPOT_LABEL=karpenter.sh/capacity-type
NODE2_NAME=${TRAINYARD_NODE2_NAME:-trainyard-node-2}
NODE2_NETNS=ty-node2
NODE2_DIR=$STATE/node2
NODE2_CGROUP=trainyard-node2
# The cgroup hierarchy: unified cgroup v2 (/sys/fs/cgroup is cgroup2fs, as on Debian 12) or v1
# (a tmpfs of per-controller hierarchies, a "hybrid" one with an empty v2 tree beside them).
# Node 2's own cgroup is /sys/fs/cgroup/$NODE2_CGROUP on v2, in the freezer hierarchy on v1.
if [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]]; then
  CGROUP_V2=1
  CGROUP_FS=/sys/fs/cgroup
else
  CGROUP_V2=0
  CGROUP_FS=/sys/fs/cgroup/freezer
fi
NODE2_CGROUP_DIR=$CGROUP_FS/$NODE2_CGROUP
# cgroup_hierarchies: every hierarchy root a cgroup of the harness may sit in (runc makes a
# container's cgroup in each v1 controller's hierarchy; v2 has the one).
cgroup_hierarchies() {
  if ((CGROUP_V2)); then
    echo /sys/fs/cgroup
  else
    local h
    for h in /sys/fs/cgroup/*/; do echo "${h%/}"; done
  fi
}
NODE2_MNTNS=$STATE/ns/node2-mnt
NODE2_KUBELET_ROOT=$NODE2_DIR/kubelet
NODE2_CONTAINERD_SOCK=$NODE2_DIR/containerd/containerd.sock
NODE2_BRIDGE=tybr1
NODE2_POD_SUBNET=10.90.0.0/16
NODE2_BRIDGE_IP=10.90.0.1
NODE2_VETH_HOST=ty-node2-h
NODE2_HOST_IP=10.91.0.1
NODE2_IP=10.91.0.2
# Every pod route the pods need: both pod subnets, the node link and the Services.
POD_ROUTES_CIDR=10.88.0.0/14
# Cluster DNS: dnsmasq on the host side of the pod bridge, fed from the API server.
CLUSTER_DNS_IP=$BRIDGE_IP
CLUSTER_DOMAIN=cluster.local
# Node 2's view of the directories that node 1's kubelet and plugins also use.
NODE2_PRIVATE_DIRS=(/var/lib/kubelet/device-plugins /var/log/pods /var/log/containers "$STATE/fake-gpus" /run/netns)
# Both nodes' kube-proxy (iptables mode). The conntrack sysctls are the host's to set.
KUBE_PROXY_FLAGS=(--proxy-mode iptables --cluster-cidr "$POD_ROUTES_CIDR"
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
  --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0s --conntrack-tcp-timeout-close-wait 0s)

# write_cni_conflist FILE NETWORK BRIDGE IS_GATEWAY SUBNET RANGE_START GATEWAY IPAM_DIR:
# a node's CNI config (bridge + host-local IPAM + portmap), routing every pod subnet and the
# Services through the node.
write_cni_conflist() {
  cat >"$1" <<CONF
{
  "cniVersion": "0.4.0",
  "name": "$2",
  "plugins": [
    {"type": "bridge", "bridge": "$3", "isGateway": $4, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$5", "rangeStart": "$6", "gateway": "$7"}]],
              "routes": [{"dst": "$POD_ROUTES_CIDR"}, {"dst": "$SERVICE_CIDR"}], "dataDir": "$8"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CONF
}
