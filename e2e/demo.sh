#!/usr/bin/env bash
# make demo: a real PyTorch DDP job under torchrun on the local two-node cluster loses its
# spot node mid-training and resumes from its checkpoint, by itself:
#   1. the two-node cluster (node 1 on-demand with 8 fake GPUs, node 2 spot with 2), the chart;
#   2. examples/trainingjob.yaml: 2 workers x 2 GPUs, one worker lands on each node;
#      beside it the same job pinned to on-demand capacity, never interrupted, for comparison;
#   3. the spot node is lost the way a reclaimed VM disappears (node2.sh lose);
#   4. the operator counts one preemption (not a failure): the job's status lines show it
#      pass through Restarting; it falls back to on-demand after fallbackToOnDemandAfter: 1,
#      and the next attempt resumes from latest.pt. Where each worker of both attempts ran
#      is printed and checked: attempt 0 had one on the spot node, attempt 1 has none there;
#      with rank 0 on the on-demand node, its worker kept its pod (restartPolicy.inPlace)
#      and the lost one's was created again; with rank 0 (torchrun's store) lost, both were
#      (said, not failed: the scheduler chose): when each started attempt 1 is printed and drawn;
#   5. both jobs finish; the final weights' SHA-256 of both are printed and compared;
#   6. both jobs' goodput ledgers (status.ledger) side by side: dollars spent, what spot
#      saved, goodput, and the GPU-seconds of each use (e2e/ledger_table.py) (last).
# The cluster stays up afterwards, with the spot node back (make cluster-down stops it).
set -euo pipefail
source "$(dirname "$0")/demo-lib.sh"
start=$SECONDS

demo_cluster_and_chart

job=$(kubectl create --dry-run=client -o jsonpath='{.metadata.name}' -f "$ROOT/examples/trainingjob.yaml")
baseline=$job-uninterrupted
say "Submitting examples/trainingjob.yaml ($job) and its uninterrupted twin ($baseline, on-demand only)"
for j in "$job" "$baseline"; do
  kubectl delete trainingjob "$j" --ignore-not-found --wait=true >/dev/null
  kubectl delete pvc "$j-checkpoints" --ignore-not-found --wait=true >/dev/null
done
kubectl apply -f "$ROOT/examples/trainingjob.yaml"
kubectl create --dry-run=client -o json -f "$ROOT/examples/trainingjob.yaml" | python3 -c '
import json, sys
job = json.load(sys.stdin)
job["metadata"]["name"] += "-uninterrupted"
# Same workers and GPUs per worker (so the same world size and data split), never on spot.
job["spec"]["spot"] = {"policy": "Never"}
print(json.dumps(job))' | kubectl apply -f -

wait_running() { # wait_running JOB ATTEMPT
  for _ in $(seq 1 300); do
    n=$(kubectl get pods -l "trainyard.dev/job=$1,trainyard.dev/attempt=$2" \
      -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Running$' || true)
    [[ $n == 2 ]] && return 0; sleep 1
  done
  echo "demo: $1 attempt $2 did not start" >&2; kubectl get pods -o wide; kubectl describe tj "$1" | tail -20; exit 1
}
# placement JOB ATTEMPT: "worker node uid" per pod of that attempt, by rank.
placement() {
  kubectl get pods -l "trainyard.dev/job=$1,trainyard.dev/attempt=$2" \
    -o jsonpath='{range .items[*]}{.metadata.labels.trainyard\.dev/rank} {.metadata.name} {.spec.nodeName} {.metadata.uid}{"\n"}{end}' |
    sort -n | cut -d' ' -f2-
}

# The progress the operator records for both jobs (status.progress), sampled once a second
# for the picture at the end (e2e/plot_progress.py), and the moments to mark on it.
samples=$STATE/demo-progress.tsv marks=$STATE/demo-marks.tsv picture=$STATE/demo-preemption.png
: >"$samples"; : >"$marks"
(
  while :; do
    now=$(date +%s.%N)
    kubectl get tj "$job" "$baseline" -o jsonpath='{range .items[*]}{.metadata.name} {.status.progress.attempt} {.status.progress.step}{"\n"}{end}' 2>/dev/null |
      awk -v t="$now" 'NF == 3 {print t, $1, $2, $3}' >>"$samples" || true
    sleep 1
  done
) &
sampler_pid=$!
trap 'kill "$sampler_pid" 2>/dev/null || true' EXIT
mark() { echo "$(date +%s.%N) $*" >>"$marks"; } # mark LABEL: now, on the picture

wait_running "$job" 0
kubectl get pods -l "trainyard.dev/job=$job" -o wide
# Recorded now: attempt 0's pods are deleted by the gang restart after the loss.
placement0=$(placement "$job" 0)
if ! grep -q " $NODE2_NAME " <<<"$placement0"; then
  echo "demo: no worker of attempt 0 landed on the spot node $NODE2_NAME:" >&2
  echo "$placement0" >&2; exit 1
fi
wait_log "$job-worker-0" "checkpoint saved at step" 300
say "torchrun is training over gloo across both nodes; rank 0 so far:"
log_of "$job-worker-0" | grep -vE '^\s*$' | tail -4

watch_tj "$job" "$STATE/demo-tj-watch.txt"
running_pods() { # running_pods JOB ATTEMPT: how many of its pods run
  kubectl get pods -l "trainyard.dev/job=$1,trainyard.dev/attempt=$2" \
    -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Running$' || true
}

say "The spot node $NODE2_NAME disappears: kubelet, containerd and containers killed at once"
bash "$HERE/cluster/node2.sh" lose
lost_at=$SECONDS lost_epoch=$(date +%s.%N)
mark "spot node lost"
say "kubectl get tj $job -w, until attempt 1 runs (at most 300 s):"
until [[ $(running_pods "$job" 1) == 2 ]]; do
  show_tj_changes
  if ((SECONDS - lost_at > 300)); then
    kill "$watch_pid" 2>/dev/null
    echo "demo: $job attempt 1 did not start within 300 s" >&2; kubectl get pods -o wide; exit 1
  fi
  sleep 1
done
sleep 2 # the watch's line for Running
show_tj_changes
kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null || true
if ! awk 'NR > 1 && $2 == "Restarting" {found = 1} END {exit !found}' "$tj_watch"; then
  echo "demo: the job never showed the Restarting phase:" >&2; cat "$tj_watch" >&2; exit 1
fi
decided=$(kubectl get tj "$job" -o jsonpath='{.status.lastRestart.time}')
[[ -n $decided ]] && echo "$(date -d "$decided" +%s) restart decided" >>"$marks"
say "Attempt 1 is running $((SECONDS - lost_at)) s after the node was lost:"
kubectl get nodes -L "$SPOT_LABEL"
kubectl get pods -l "trainyard.dev/job=$job,trainyard.dev/attempt=1" -o wide
placement1=$(placement "$job" 1)
say "Where each worker ran"
while read -r pod node uid; do echo "  attempt 0: $pod on $node (pod uid $uid)"; done <<<"$placement0"
while read -r pod node uid; do
  if grep -qF " $uid" <<<"$placement0"; then how="the same pod: restarted in place"; else how="a new pod"; fi
  echo "  attempt 1: $pod on $node (pod uid $uid, $how)"
done <<<"$placement1"
if [[ $(wc -l <<<"$placement1") != 2 ]] || grep -qv " $NODE_NAME " <<<"$placement1"; then
  echo "demo: attempt 1 is not all on the on-demand node $NODE_NAME" >&2; exit 1
fi
echo "  checked: attempt 0 had a worker on the spot node; attempt 1 runs on the on-demand node only"
in_place=$(kubectl get tj "$job" -o jsonpath='{.status.lastRestart.inPlaceRanks}')
# Which rank the scheduler put on the spot node decides whether a worker can keep its pod:
# rank 0 hosts torchrun's rendezvous store, and when it goes the survivor's torchrun exits
# (its containers stop), so both pods are created again. Rank 0 on node 1 keeps its pod.
if grep -q "^$job-worker-0 $NODE2_NAME " <<<"$placement0"; then
  if [[ -n $in_place ]]; then
    echo "demo: rank 0 was lost with the spot node, yet status.lastRestart.inPlaceRanks is '$in_place'" >&2; exit 1
  fi
  kept_pod=""
  echo "  rank 0 (torchrun's rendezvous store) ran on the spot node this time: the survivor's"
  echo "  torchrun exited when the store went, so no worker could keep its pod and both were"
  echo "  created again (with rank 0 on $NODE_NAME the survivor restarts in place: docs/e2e.md)"
else
  kept_pod=$job-worker-${in_place:-none}
  if [[ ! $in_place =~ ^[0-9]+$ ]] || ! grep -q "^$kept_pod $NODE_NAME " <<<"$placement0" ||
     [[ $(grep "^$kept_pod " <<<"$placement0" | cut -d' ' -f3) != $(grep "^$kept_pod " <<<"$placement1" | cut -d' ' -f3) ]]; then
    echo "demo: the worker on $NODE_NAME did not restart in place (status.lastRestart.inPlaceRanks '$in_place')" >&2
    kubectl describe tj "$job" | sed -n '/^Events:/,$p' >&2; exit 1
  fi
  echo "  checked: worker $in_place kept its pod, so its GPUs, and restarted in place"
fi
wait_log "$job-worker-0" "resuming from step" 180
log_of "$job-worker-0" | grep -E 'resuming from step' | tail -1
wait_log "$job-worker-0" "first step of attempt 1" 180
say "From the loss to training again, in seconds after the loss"
stage() { awk -v t="$2" -v l="$lost_epoch" -v what="$1" 'BEGIN {printf "  %-52s %5.1f s\n", what, t - l}'; }
stage "restart decided (status.lastRestart.time)" "$(date -d "$decided" +%s)"
container_started() { # container_started POD: its trainer container's start, in epoch seconds
  date -d "$(kubectl get pod "$1" -o jsonpath='{.status.containerStatuses[?(@.name=="trainer")].state.running.startedAt}')" +%s
}
started=0
if [[ -n $kept_pod ]]; then
  # The two ways into attempt 1: the kept worker's supervisor stops and starts its trainer;
  # the lost worker's pod is created again and its container starts.
  # Its trainer either exited by itself (a collective broken by the loss; the supervisor holds
  # the container for the operator's word) or was stopped on the operator's order.
  stopped_in_place=$(log_time "$kept_pod" "attempt 0 stopped on the operator's order" ||
    log_time "$kept_pod" "holding for the operator's decision")
  started_in_place=$(log_time "$kept_pod" "starting attempt 1 in place")
  stage "$kept_pod attempt 0 ended in place" "$stopped_in_place"
  stage "$kept_pod started attempt 1 in place" "$started_in_place"
  echo "$started_in_place worker $in_place restarted in place" >>"$marks"
  started=$started_in_place
fi
while read -r new_pod; do
  new_started=$(container_started "$new_pod")
  stage "$new_pod (a new pod) trainer container started" "$new_started"
  echo "$new_started new pod $new_pod started" >>"$marks"
  started=$(printf '%s\n' "$started" "$new_started" | sort -n | tail -1)
done < <(grep -v "^${kept_pod:-none} " <<<"$placement1" | cut -d' ' -f1)
stage "attempt 1 running (both workers started)" "$started"
stage "first step of attempt 1 (rank 0's log)" "$(log_time "$job-worker-0" "first step of attempt 1")"
echo "  with the controller-manager's --node-monitor-grace-period $(cat "$STATE/node-monitor-grace-period") and the operator's nodeNotReadyTimeoutSeconds ${not_ready_timeout:-30 (e2e/values-local.yaml)}"
say "What the operator recorded (kubectl describe tj $job):"
kubectl describe tj "$job" | sed -n '/^Events:/,$p'

say "Waiting for both jobs to finish"
wait_phase "$job" Succeeded 900
wait_phase "$baseline" Succeeded 900
kubectl get tj "$job" "$baseline"
sleep 2 # the last status.progress
kill "$sampler_pid" 2>/dev/null || true
say "Training step over time, as the operator recorded it"
/usr/bin/python3 "$HERE/plot_progress.py" "$samples" "$marks" "$picture"

say "Bringing the spot node back"
bash "$HERE/cluster/node2.sh" start
echo
echo "Demo done in $((SECONDS - start)) s. Explore with: KUBECONFIG=$KUBECONFIG_FILE $K8S_BIN/kubectl get tj,pods -o wide"
echo "Lose the spot node by hand: bash e2e/cluster/node2.sh lose (and start). Stop everything: make cluster-down"

equal=0
compare_weights "$job" "preempted job    " "$baseline" "uninterrupted job" \
  "the job resumed bit-exact after losing its spot node" || equal=1

say "What spot saved: both jobs' ledgers (status.ledger), preempted first"
kubectl get tj "$job" "$baseline" -o json | /usr/bin/python3 "$HERE/ledger_table.py"
exit $equal
