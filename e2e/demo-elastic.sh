#!/usr/bin/env bash
# make demo ELASTIC=1: an elastic job keeps training with the workers left when its spot node
# is lost and no capacity remains, and grows back when the node returns:
#   1. the two-node cluster and the chart, as in e2e/demo.sh; another pod holds six of node 1's
#      eight GPUs, so node 1 has room for two one-GPU workers and node 2 (spot) for two;
#   2. examples/trainingjob-elastic.yaml: 4 workers x 1 GPU, spec.elastic (minWorkers 2,
#      replacementWaitSeconds 20), restartPolicy.inPlace: two workers on each node;
#   3. node 2 is lost (node2.sh lose): one preemption; the lost workers' replacements find no
#      room, and after 20 s the job trains on with the two workers on node 1 (Shrink, the
#      WORLD column 2), which keep their pods; printed: the job's status line at each change,
#      and from the loss to training again at the smaller size;
#   4. node 2 returns: the job saves a checkpoint on request and grows back to four (Grow);
#   5. it finishes; the same job run at four workers throughout (after it, on node 1) ends
#      with the same final weights, bit for bit, which the demo checks;
#   6. the job's ledger: GPU time at each size, and what running shrunk cost against waiting
#      and against on-demand capacity.
# The cluster stays up afterwards, with the spot node back (make cluster-down stops it).
set -euo pipefail
source "$(dirname "$0")/demo-lib.sh"
start=$SECONDS

demo_cluster_and_chart

job=$(kubectl create --dry-run=client -o jsonpath='{.metadata.name}' -f "$ROOT/examples/trainingjob-elastic.yaml")
twin=$job-uninterrupted
for j in "$job" "$twin"; do
  kubectl delete trainingjob "$j" --ignore-not-found --wait=true >/dev/null
  kubectl delete pvc "$j-checkpoints" --ignore-not-found --wait=true >/dev/null
done
kubectl delete pod other-team --ignore-not-found --wait=true >/dev/null

say "Another team's pod takes six of node 1's eight GPUs"
kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: other-team}
spec:
  nodeSelector: {kubernetes.io/hostname: $NODE_NAME}
  terminationGracePeriodSeconds: 0
  containers:
    - name: sleep
      image: trainyard/torch-trainer:dev
      imagePullPolicy: IfNotPresent
      command: [sleep, infinity]
      resources: {limits: {nvidia.com/gpu: 6}}
EOF
kubectl wait --for=condition=Ready pod/other-team --timeout=120s >/dev/null

say "Submitting examples/trainingjob-elastic.yaml ($job): 4 workers x 1 GPU, minWorkers 2"
kubectl apply -f "$ROOT/examples/trainingjob-elastic.yaml"

running() { # running JOB WORKERS: whether the job runs with that many workers
  [[ $(kubectl get tj "$1" -o jsonpath='{.status.phase} {.status.worldSize}') == "Running $2" ]]
}
wait_for() { # wait_for SECONDS WHAT COMMAND...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq 1 "$seconds"); do "$@" && return 0; sleep 1; done
  echo "demo: $what not within $seconds s" >&2; kubectl get tj,pods -o wide >&2
  kubectl describe tj "$job" | sed -n '/^Events:/,$p' >&2; exit 1
}
where() { # where JOB: "worker node uid attempt" per pod, by rank
  kubectl get pods -l "trainyard.dev/job=$1" --sort-by=.metadata.name \
    -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.uid} {.metadata.labels.trainyard\.dev/attempt}{"\n"}{end}'
}
wait_for 300 "$job running with 4 workers" running "$job" 4
say "Four workers, two on each node:"
where "$job" | while read -r pod node uid attempt; do echo "  $pod on $node (attempt $attempt, pod uid $uid)"; done
before=$(where "$job")
on_spot=$(grep -c " $NODE2_NAME " <<<"$before" || true)
if [[ $on_spot != 2 ]]; then echo "demo: $on_spot workers on the spot node, not 2" >&2; exit 1; fi
wait_log "$job-worker-0" "checkpoint saved at step" 300

watch_tj "$job" "$STATE/demo-elastic-tj-watch.txt"
trap 'kill "$watch_pid" 2>/dev/null || true' EXIT
follow() { # follow SECONDS WORKERS: shows the status line's changes until the job runs that many
  local until=$((SECONDS + $1))
  until running "$job" "$2"; do
    show_tj_changes
    if ((SECONDS > until)); then
      echo "demo: $job did not run with $2 workers in time" >&2; kubectl get tj,pods -o wide >&2; exit 1
    fi
    sleep 1
  done
  sleep 2; show_tj_changes
}
stage() { awk -v t="$2" -v l="$3" -v what="$1" 'BEGIN {printf "  %-52s %5.1f s\n", what, t - l}'; }
epoch() { date -d "$1" +%s.%N; }
# stages ATTEMPT SINCE_EPOCH: when the attempt was decided, ran, and trained its first step.
stages() {
  local decided last=0 started
  decided=$(kubectl get tj "$job" -o jsonpath='{.status.lastRestart.time}')
  stage "$(kubectl get tj "$job" -o jsonpath='{.status.lastRestart.reason}') decided (status.lastRestart.time)" "$(epoch "$decided")" "$2"
  for pod in $(kubectl get pods -l "trainyard.dev/job=$job,trainyard.dev/attempt=$1" -o name); do
    started=$(log_time "${pod#pod/}" "starting attempt $1 in place" ||
      epoch "$(kubectl get "$pod" -o jsonpath='{.status.containerStatuses[?(@.name=="trainer")].state.running.startedAt}')")
    last=$(printf '%s\n' "$last" "$started" | sort -n | tail -1)
  done
  stage "attempt $1 running (every worker started)" "$last" "$2"
  wait_log "$job-worker-0" "first step of attempt $1" 180
  stage "first step of attempt $1 (rank 0's log)" "$(log_time "$job-worker-0" "first step of attempt $1")" "$2"
}

say "The spot node $NODE2_NAME disappears with two of the four workers; node 1 has no room for them"
bash "$HERE/cluster/node2.sh" lose
lost_at=$SECONDS lost_epoch=$(date +%s.%N)
say "kubectl get tj $job -w, until it trains with 2 workers:"
follow 300 2
shrunk=$(kubectl get tj "$job" -o jsonpath='{.status.attempt}')
say "Training again with 2 of 4 workers, in seconds after the loss"
stages "$shrunk" "$lost_epoch"
log_of "$job-worker-0" | grep -E 'elastic: world size|resuming from step' | tail -2
say "Where each worker runs now"
where "$job" | while read -r pod node uid attempt; do
  if grep -qF " $uid " <<<"$before"; then how="the same pod as before the loss"; else how="a new pod"; fi
  echo "  $pod on $node (attempt $attempt, $how)"
done
kubectl get tj "$job" -o jsonpath='{range .status.conditions[?(@.type=="Shrunk")]}  Shrunk={.status} {.reason}: {.message}{"\n"}{end}'

say "The spot node returns: the job saves a checkpoint and grows back to 4 workers"
bash "$HERE/cluster/node2.sh" start
for _ in $(seq 1 180); do
  gpus=$(kubectl get node "$NODE2_NAME" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')
  [[ $gpus == 2 ]] && break; sleep 1
done
back_at=$SECONDS back_epoch=$(date +%s.%N)
lost_at=$back_at
follow 300 4
grown=$(kubectl get tj "$job" -o jsonpath='{.status.attempt}')
say "Training again with 4 of 4 workers, in seconds after node 2 advertised its GPUs again"
stages "$grown" "$back_epoch"
kill "$watch_pid" 2>/dev/null || true

say "What the operator recorded (kubectl describe tj $job):"
kubectl describe tj "$job" | sed -n '/^Events:/,$p'
wait_phase "$job" Succeeded 900
kubectl get tj "$job"

say "The same job at 4 workers throughout, for the final weights (node 1 now has room)"
kubectl delete pod other-team --wait=true >/dev/null
kubectl create --dry-run=client -o json -f "$ROOT/examples/trainingjob-elastic.yaml" | /usr/bin/python3 -c '
import json, sys
job = json.load(sys.stdin)
job["metadata"]["name"] += "-uninterrupted"
job["spec"]["spot"] = {"policy": "Never"}
for var in job["spec"]["template"]["spec"]["containers"][0]["env"]:
    if var["name"] == "STEP_SECONDS":
        var["value"] = "0"
print(json.dumps(job))' | kubectl apply -f -
wait_phase "$twin" Succeeded 600

equal=0
compare_weights "$job" "shrunk and grown" "$twin" "4 workers always" \
  "the job trained the same computation at 2 and at 4 workers" || equal=1

say "The ledger by size (status.ledger.elastic)"
by_size=$(cat <<'PY'
import json, sys
ledger = json.load(sys.stdin)["status"]["ledger"]
elastic = ledger.get("elastic", {})
for size in elastic.get("byWorkers", []):
    print(f"  {size['workers']} of {size['of']} workers: ran {size['wallMillis'] / 1000:7.1f} s, "
          f"{size['gpuMillis'] / 1000:8.1f} GPU-s")
shrunk = elastic.get("shrunkMicroDollars", 0) / 1e6
on_demand = elastic.get("onDemandInsteadMicroDollars", 0) / 1e6
print(f"  while shrunk: spent ${shrunk:.4f}, which waiting would have billed for the same GPUs idle;"
      f" every worker on on-demand for as long: ${on_demand:.4f}")
print(f"  the whole job: {ledger.get('cost', '')} spent, goodput {ledger.get('goodput', '')}")
PY
)
kubectl get tj "$job" -o json | /usr/bin/python3 -c "$by_size"
echo
echo "Demo done in $((SECONDS - start)) s. Stop everything: make cluster-down"
exit $equal
