#!/usr/bin/env bash
# make demo: a local cluster with 8 simulated GPUs, the Helm chart, the example
# TrainingJob, a spot preemption of one worker, and the resume from latest.pt.
# The cluster stays up afterwards (make cluster-down stops it).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
source "$HERE/cluster/env.sh"
export KUBECONFIG=$KUBECONFIG_FILE PATH=$K8S_BIN:$PATH
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "Bringing up the local cluster (the first run builds Kubernetes 1.20: ~5-8 minutes)"
bash "$HERE/cluster/up.sh"
bash "$HERE/cluster/images.sh" trainer operator device-plugin

say "Installing the chart with 8 fake A100 GPUs"
mkdir -p "$STATE/fake-gpus"
cp "$ROOT/device-plugin/examples/fake-gpus-8.yaml" "$STATE/fake-gpus/fake-gpus.yaml"
PY=${TRAINYARD_CACHE:-$HOME/.cache/trainyard}/venv/bin/python
# Install, or bring an existing release (e.g. the e2e tests', which watches
# only their namespace) to the demo's values: the operator watches every namespace.
if kubectl -n trainyard-system get deploy trainyard-operator >/dev/null 2>&1; then
  "$PY" "$HERE/helm.py" upgrade trainyard "$ROOT/charts/trainyard" trainyard-system --values "$HERE/values-local.yaml"
  kubectl -n trainyard-system rollout restart deploy/trainyard-operator ds/trainyard-device-plugin >/dev/null
else
  "$PY" "$HERE/helm.py" install trainyard "$ROOT/charts/trainyard" trainyard-system --values "$HERE/values-local.yaml"
fi
kubectl -n trainyard-system rollout status deploy/trainyard-operator --timeout=180s
kubectl -n trainyard-system rollout status ds/trainyard-device-plugin --timeout=180s
for _ in $(seq 1 120); do
  gpus=$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')
  [[ $gpus == 8 ]] && break; sleep 1
done
echo "node $NODE_NAME allocatable nvidia.com/gpu: ${gpus:-0}"
kubectl get node "$NODE_NAME" -o json | python3 -c 'import json,sys; l=json.load(sys.stdin)["metadata"]["labels"]; [print(f"  {k}={v}") for k,v in sorted(l.items()) if k.startswith("nvidia.com/")]'

say "Submitting examples/trainingjob.yaml (2 workers x 2 GPUs)"
kubectl delete trainingjob demo --ignore-not-found --wait=true >/dev/null
kubectl delete pvc demo-checkpoints --ignore-not-found --wait=true >/dev/null
kubectl apply -f "$ROOT/examples/trainingjob.yaml"
job=$(kubectl create --dry-run=client -o jsonpath='{.metadata.name}' -f "$ROOT/examples/trainingjob.yaml")
wait_running() { # wait_running ATTEMPT
  for _ in $(seq 1 120); do
    n=$(kubectl get pods -l "trainyard.dev/job=$job,trainyard.dev/attempt=$1" \
      -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Running$' || true)
    [[ $n == 2 ]] && return 0; sleep 1
  done
  echo "demo: attempt $1 pods did not start" >&2; kubectl get pods -o wide; kubectl describe tj "$job" | tail -20; exit 1
}
wait_running 0
kubectl get tj "$job"; kubectl get pods -l "trainyard.dev/job=$job" -o wide
log_of() { cat /var/log/pods/default_"$1"_*/trainer/*.log 2>/dev/null | cut -d' ' -f4-; }
sleep 8
say "Rank 0 is training; its log so far:"
log_of "$job-worker-0" | tail -4

say "Preempting $job-worker-1 as a kubelet graceful node shutdown would (DisruptionTarget, then delete)"
"$TARGET/debug/trainyard-e2e" preempt default "$job-worker-1" TerminationByKubelet
wait_running 1
sleep 3
say "Attempt 1 is running. Rank 0 of the new attempt says:"
log_of "$job-worker-0" | grep -iE 'resum|start' | tail -3
kubectl get tj "$job"
say "Events on the TrainingJob:"
kubectl describe tj "$job" | sed -n '/^Events:/,$p'
echo
echo "The job runs on to completion. Watch it with: KUBECONFIG=$KUBECONFIG_FILE $K8S_BIN/kubectl get tj -w"
echo "Stop the cluster with: make cluster-down"
