#!/usr/bin/env bash
# A bare Kubernetes 1.20 control plane for benchmarks: etcd, kube-apiserver (TLS, Node+RBAC
# authorization), kube-controller-manager and kube-scheduler, no node, no kubelet; beside the
# local e2e cluster (up.sh) and never touching it. The operator benchmark brings one up per run
# so that every run starts on an empty etcd.
#
#   control-plane.sh up DIR [PORT_BASE]   start it; writes DIR/kubeconfig (admin, client cert)
#   control-plane.sh down DIR             stop exactly the processes `up DIR` started
#
# DIR holds everything: pki/ (made once, kept), etcd/ (emptied on every up and down), logs/,
# pids/<component>.pid (the names the benchmark's CPU sampler reads when TRAINYARD_E2E_STATE
# is DIR) and the components' kubeconfigs. Ports: the API server on PORT_BASE (default 27443),
# etcd's client and peer ports on PORT_BASE+1 and +2, the controller-manager's and the
# scheduler's secure ports on +3 and +4; the Service CIDR is 10.250.0.0/24. Up fails when DIR
# is already up or a port is taken, and stops what it started when a component does not come
# up. The PKI, kubeconfigs and flags are up.sh's (pki.sh: the same request limits and node
# timers), so that figures taken here compare with the e2e cluster's; up also applies a default
# StorageClass (the in-tree hostPath provisioner) and crds/trainingjob.yaml, and returns once
# the CRD is established.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=env.sh
source "$HERE/env.sh"
# shellcheck source=pki.sh
source "$HERE/pki.sh"

SERVICE_CIDR=10.250.0.0/24
SERVICE_IP=10.250.0.1
# Stopped in this order: the clients of the API server first, etcd last.
COMPONENTS=(kube-scheduler kube-controller-manager kube-apiserver etcd)

usage() {
  echo "usage: $0 up DIR [PORT_BASE] | down DIR" >&2
  exit 2
}

# running PID: the process exists and has not exited (a zombie has).
running() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

# pid_of NAME: the PID recorded for NAME when that process is still running the component
# this DIR started (a reused PID is not it: its command line names DIR).
pid_of() {
  local f=$PIDS_DIR/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] && running "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/" || return 1
  echo "$pid"
}

# stop NAME: SIGTERM, up to 30 s for it to exit, then SIGKILL and wait for that too.
stop() {
  local pid
  if pid=$(pid_of "$1"); then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 120); do pid_of "$1" >/dev/null || break; sleep 0.25; done
    if pid_of "$1" >/dev/null; then
      echo "control-plane: $1 (pid $pid) ignored SIGTERM for 30 s; killing it"
      kill -9 "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do pid_of "$1" >/dev/null || break; sleep 0.25; done
    fi
    if pid_of "$1" >/dev/null; then
      echo "control-plane: $1 (pid $pid) is still running" >&2
      return 1
    fi
    echo "control-plane: stopped $1 (pid $pid)"
  fi
  rm -f "$PIDS_DIR/$1.pid"
}

# remove_provisioned_volumes: the hostPath provisioner's directories (/tmp/hostpath_pv/<id>,
# outside DIR) of this cluster's volumes go with its etcd, as down.sh does for the e2e cluster.
remove_provisioned_volumes() {
  pid_of kube-apiserver >/dev/null || return 0
  local dir
  "$K8S_BIN/kubectl" --kubeconfig "$DIR/kubeconfig" --request-timeout 10s get pv \
    -o jsonpath='{range .items[*]}{.spec.hostPath.path}{"\n"}{end}' 2>/dev/null |
    grep -E '^/tmp/hostpath_pv/[0-9a-f-]+$' |
    while read -r dir; do rm -rf -- "$dir"; done || true
}

down() {
  local failed=0 name
  remove_provisioned_volumes
  for name in "${COMPONENTS[@]}"; do stop "$name" || failed=1; done
  ((failed == 0)) || return 1
  rm -rf "$DIR/etcd"
}

# start NAME CMD...: CMD in the background in a session of its own (a Ctrl-C at the terminal
# reaches the caller, whose cleanup then runs `down`), its own PID recorded (exec: the
# program's PID, not a wrapping shell's).
start() {
  local name=$1
  shift
  setsid bash -c 'exec "$@"' _ "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS_DIR/$name.pid"
  echo "control-plane: started $name (pid $!)"
}

# wait_for DESC TIMEOUT_S CMD...: until CMD succeeds; fails when the time is up, or at once
# when DESC names a component that has exited.
wait_for() {
  local desc=$1 deadline=$((SECONDS + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    # (Not pid_of: just started, the process may not have exec'd the component yet.)
    if [[ -f $PIDS_DIR/$desc.pid ]] && ! running "$(<"$PIDS_DIR/$desc.pid")"; then
      echo "control-plane: $desc exited; see $DIR/logs/$desc.log" >&2
      return 1
    fi
    if ((SECONDS > deadline)); then
      echo "control-plane: timed out waiting for $desc; see $DIR/logs" >&2
      return 1
    fi
    sleep 0.5
  done
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
healthy() { curl -skf --max-time 2 "https://127.0.0.1:$1/healthz"; }

kubeconfig() { # kubeconfig FILE CERTNAME
  write_kubeconfig "$1" trainyard-bench "https://127.0.0.1:$APISERVER_PORT" "$PKI" "$2"
}

start_etcd_and_apiserver() {
  local -a flags
  rm -rf "$DIR/etcd"
  etcd_flags flags trainyard-bench "$DIR/etcd" "$ETCD_PORT" "$ETCD_PEER_PORT"
  start etcd /usr/bin/etcd "${flags[@]}"
  wait_for etcd 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ETCD_PORT"
  apiserver_flags flags "$PKI" "$ETCD_PORT" "$APISERVER_PORT" 127.0.0.1 "$SERVICE_CIDR"
  start kube-apiserver "$K8S_BIN/kube-apiserver" "${flags[@]}"
  wait_for kube-apiserver 90 "${KUBECTL[@]}" get --raw /readyz
}

start_controllers() {
  local -a flags
  # Kubernetes' default node grace period (40 s), not the e2e cluster's 15 s: nothing here
  # tests NotReady, and the benchmark's fake nodes renew their Leases every 10 s, which with
  # 1,000 of them on a busy API server can lag past 15 s (nodes marked NotReady, their pods
  # evicted, a run that cannot finish).
  controller_manager_flags flags "$DIR/controller-manager.kubeconfig" "$CONTROLLER_MANAGER_PORT" "$PKI" ""
  start kube-controller-manager "$K8S_BIN/kube-controller-manager" "${flags[@]}"
  scheduler_flags flags "$DIR/scheduler.kubeconfig" "$SCHEDULER_PORT"
  start kube-scheduler "$K8S_BIN/kube-scheduler" "${flags[@]}"
  wait_for kube-controller-manager 60 healthy "$CONTROLLER_MANAGER_PORT"
  wait_for kube-scheduler 60 healthy "$SCHEDULER_PORT"
}

apply_cluster_objects() {
  "${KUBECTL[@]}" apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
EOF
  "${KUBECTL[@]}" apply -f "$ROOT/crds/trainingjob.yaml" >/dev/null
  "${KUBECTL[@]}" wait --for condition=established --timeout=60s crd/trainingjobs.trainyard.dev >/dev/null
  # Pods need their namespace's service account and its token (the controller-manager's).
  wait_for "the default service account" 60 "${KUBECTL[@]}" -n default get serviceaccount default
}

up() {
  local name pid port
  for name in "${COMPONENTS[@]}"; do
    if pid=$(pid_of "$name"); then
      echo "control-plane: $DIR is already up ($name, pid $pid); run '$0 down $DIR' first" >&2
      exit 1
    fi
  done
  for port in "$APISERVER_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT" "$CONTROLLER_MANAGER_PORT" "$SCHEDULER_PORT"; do
    port_free "$port" || { echo "control-plane: port $port is in use" >&2; exit 1; }
  done
  "$HERE/build-k8s.sh" >/dev/null
  rm -f "$PIDS_DIR"/*.pid
  mkdir -p "$DIR/logs" "$PIDS_DIR"
  make_pki "$PKI" trainyard-bench-ca trainyard-bench-admin \
    "IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  kubeconfig "$DIR/kubeconfig" admin
  kubeconfig "$DIR/controller-manager.kubeconfig" controller-manager
  kubeconfig "$DIR/scheduler.kubeconfig" scheduler
  # A component that does not come up: stop the others, leave nothing running.
  trap 'echo "control-plane: up failed; stopping what it started" >&2; down || true' EXIT
  start_etcd_and_apiserver
  start_controllers
  apply_cluster_objects
  trap - EXIT
  echo "control-plane: ready. export KUBECONFIG=$DIR/kubeconfig"
}

[[ $# -ge 2 ]] || usage
command=$1
[[ $command == up ]] && mkdir -p "$2"
[[ -d $2 ]] || { echo "control-plane: $2 does not exist, nothing to stop"; exit 0; }
DIR=$(cd "$2" && pwd)
PIDS_DIR=$DIR/pids
PKI=$DIR/pki
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$DIR/kubeconfig")
case $command in
  up)
    [[ $# -le 3 ]] || usage
    APISERVER_PORT=${3:-27443}
    ETCD_PORT=$((APISERVER_PORT + 1))
    ETCD_PEER_PORT=$((APISERVER_PORT + 2))
    CONTROLLER_MANAGER_PORT=$((APISERVER_PORT + 3))
    SCHEDULER_PORT=$((APISERVER_PORT + 4))
    up
    ;;
  down)
    [[ $# -eq 2 ]] || usage
    down
    ;;
  *) usage ;;
esac
