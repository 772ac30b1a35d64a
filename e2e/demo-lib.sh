# Sourced by the demos (e2e/demo.sh, e2e/demo-elastic.sh): the cluster and the chart, and
# what they read of the trainers' logs.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
source "$HERE/cluster/env.sh"
export KUBECONFIG=$KUBECONFIG_FILE PATH=$K8S_BIN:$PATH
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

# The local two-node cluster, the images and the chart, the operator watching every
# namespace; waits until both nodes advertise their GPUs.
demo_cluster_and_chart() {
  say "Bringing up the local two-node cluster (the first run also builds the trainer, operator and device-plugin images: minutes)"
  bash "$HERE/cluster/up.sh"
  bash "$HERE/cluster/images.sh" torch-trainer operator device-plugin
  kubectl get nodes -L "$SPOT_LABEL" -o wide

  say "Installing the chart: 8 fake A100s on the on-demand node, 2 on the spot node"
  mkdir -p "$STATE/fake-gpus"
  cp "$ROOT/device-plugin/examples/fake-gpus-8.yaml" "$STATE/fake-gpus/fake-gpus.yaml"
  PY=${TRAINYARD_CACHE:-$HOME/.cache/trainyard}/venv/bin/python
  # Install, or bring an existing release (e.g. the e2e tests', which watches
  # only their namespace) to the demo's values: the operator watches every namespace.
  # TRAINYARD_DEFAULT_TIMERS=1: the operator at its default config (with up.sh's, the
  # controller-manager at its default grace period), to measure a loss as production sees it.
  values=(--values "$HERE/values-local.yaml")
  if [[ -n ${TRAINYARD_DEFAULT_TIMERS:-} ]]; then
    not_ready_timeout=60
    values+=(--set-json '{"operator":{"config":{"nodeNotReadyTimeoutSeconds":60}}}')
  fi
  if kubectl -n trainyard-system get deploy trainyard-operator >/dev/null 2>&1; then
    # helm upgrade never changes the CRD (docs/install.md, "Upgrading"): this checkout's first.
    kubectl apply --server-side --force-conflicts -f "$ROOT/charts/trainyard/crds/trainingjob.yaml" >/dev/null
    kubectl wait --for condition=Established crd/trainingjobs.trainyard.dev >/dev/null
    "$PY" "$HERE/helm.py" upgrade trainyard "$ROOT/charts/trainyard" trainyard-system "${values[@]}"
    kubectl -n trainyard-system rollout restart deploy/trainyard-operator ds/trainyard-device-plugin >/dev/null
  else
    "$PY" "$HERE/helm.py" install trainyard "$ROOT/charts/trainyard" trainyard-system "${values[@]}"
  fi
  kubectl uncordon "$NODE2_NAME" >/dev/null
  kubectl -n trainyard-system rollout status deploy/trainyard-operator --timeout=180s
  kubectl -n trainyard-system rollout status ds/trainyard-device-plugin --timeout=180s
  for node in "$NODE_NAME" "$NODE2_NAME"; do
    for _ in $(seq 1 120); do
      gpus=$(kubectl get node "$node" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')
      [[ -n $gpus && $gpus != 0 ]] && break; sleep 1
    done
    echo "node $node ($(kubectl get node "$node" -o jsonpath="{.metadata.labels.karpenter\.sh/capacity-type}")): allocatable nvidia.com/gpu ${gpus:-0}"
  done
}

# The trainer log files (CRI lines: time, stream, tag, message) of the pod of that name now,
# by its uid (a pod of the same name from an earlier attempt or an earlier demo leaves its own,
# on node 2 even after the node is gone), from the node's /var/log/pods (node 2's private copy
# survives its loss). A pod kept for an in-place restart keeps its uid: its log holds both
# attempts.
log_files() { # log_files POD
  local f uid
  uid=$(kubectl get pod "$1" -o jsonpath='{.metadata.uid}' 2>/dev/null) || return 0
  [[ -n $uid ]] || return 0
  for f in /var/log/pods/default_"$1"_"$uid"/trainer/*.log \
           "$NODE2_DIR"/private/var/log/pods/default_"$1"_"$uid"/trainer/*.log; do
    [[ -f $f ]] && echo "$f"
  done
  return 0
}
log_of() { # log_of POD: the trainer's log of the pod of that name now, from either node
  local f
  while read -r f; do cut -d' ' -f4- "$f"; done < <(log_files "$1")
}
log_time() { # log_time POD TEXT: when its trainer first logged TEXT (the CRI log's time), in epoch seconds
  local f line
  while read -r f; do
    line=$(grep -m1 -F -- "$2" "$f") || continue
    date -d "${line%% *}" +%s.%N; return 0
  done < <(log_files "$1")
  return 1
}
wait_log() { # wait_log POD TEXT SECONDS
  local text
  for _ in $(seq 1 "$3"); do
    text=$(log_of "$1"); [[ $text == *"$2"* ]] && return 0; sleep 1
  done
  echo "demo: $1 never logged '$2'" >&2; log_of "$1" | tail -20; exit 1
}
wait_phase() { # wait_phase JOB PHASE SECONDS
  for _ in $(seq 1 "$3"); do
    [[ $(kubectl get tj "$1" -o jsonpath='{.status.phase}') == "$2" ]] && return 0; sleep 1
  done
  echo "demo: $1 did not reach $2" >&2; kubectl describe tj "$1" | tail -20; exit 1
}

# The job's status line, every change of it, from a watch (a poll could miss a short phase):
# watch_tj JOB FILE starts it; show_tj_changes prints the lines not shown yet, each with the
# seconds since $lost_at.
watch_tj() {
  tj_watch=$2 shown=0
  kubectl get tj "$1" -w >"$tj_watch" 2>&1 &
  watch_pid=$!
}
show_tj_changes() {
  local lines i
  mapfile -t lines <"$tj_watch"
  for ((i = shown; i < ${#lines[@]}; i++)); do
    # kubectl pads each watched line on its own: align the columns again.
    ((i == 0)) && { printf '  %6s  %s\n' "" "$(columns "${lines[0]}")"; continue; }
    [[ ${lines[i]} == "${lines[i - 1]}" ]] ||
      printf '  %5ss  %s\n' "$((SECONDS - lost_at))" "$(columns "${lines[i]}")"
  done
  shown=${#lines[@]}
}
columns() { awk '{printf "%-14s %-11s %-8s %-6s %-5s %-8s %s", $1, $2, $3, $4, $5, $6, $7}' <<<"$1"; }

# compare_weights JOB WHAT TWIN TWIN_WHAT EQUAL: prints the final weights' digests rank 0 of
# both jobs logged and whether they are equal (then EQUAL); fails when they are not.
compare_weights() {
  local a b
  a=$(log_of "$1-worker-0" | sed -n 's/.*final weights sha256 \([0-9a-f]*\).*/\1/p' | tail -1)
  b=$(log_of "$3-worker-0" | sed -n 's/.*final weights sha256 \([0-9a-f]*\).*/\1/p' | tail -1)
  say "Final weights"
  echo "  $2 $1: sha256 ${a:-missing}"
  echo "  $4 $3: sha256 ${b:-missing}"
  if [[ -n $a && $a == "$b" ]]; then
    echo "  equal: $5"
    return 0
  fi
  echo "  NOT equal" >&2
  return 1
}
