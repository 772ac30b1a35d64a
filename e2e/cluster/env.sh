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
SERVICE_CIDR=10.96.0.0/16
CONTAINERD_SOCK=$STATE/containerd/containerd.sock
LOGS=$STATE/logs
PIDS=$STATE/pids
