#!/usr/bin/env bash
# Runs a command against the local cluster: brings it up (or reuses a running
# one), imports the images, runs the command with KUBECONFIG set, and stops the
# cluster afterwards — also when the command fails or is interrupted — unless
# the cluster was already running before (then it is left as found) or
# TRAINYARD_E2E_KEEP_UP=1.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/cluster/env.sh"

was_up=0
if [[ ${TRAINYARD_E2E_EXISTING:-0} != 1 && -f $PIDS/kube-apiserver.pid ]] &&
   kill -0 "$(cat "$PIDS/kube-apiserver.pid")" 2>/dev/null; then
  was_up=1
fi
keeper=
cleanup() {
  local rc=$?
  if [[ -n $keeper ]]; then kill -- -"$keeper" 2>/dev/null; wait "$keeper" 2>/dev/null || true; fi
  if [[ $was_up == 0 && ${TRAINYARD_E2E_KEEP_UP:-0} != 1 ]]; then
    date +"with-cluster: down from %T"
    # down.sh verifies that nothing of the harness is left; if something is, the run fails.
    if ! TRAINYARD_E2E_LOGS_TO=$logs_to bash "$HERE/cluster/down.sh"; then
      ((rc)) || rc=1
    fi
  fi
  if ((rc)); then
    echo "with-cluster: failed (exit $rc); the logs of every pod the run saw (deleted ones too) and of every component: $logs_to" >&2
  fi
  exit $rc
}
logs_to=${TRAINYARD_E2E_LOGS_TO:-$(dirname "$HERE")/target/e2e-logs}
trap cleanup EXIT INT TERM

date +"with-cluster: up from %T"
bash "$HERE/cluster/up.sh"
if [[ ${TRAINYARD_E2E_EXISTING:-0} != 1 ]]; then
  export KUBECONFIG=$KUBECONFIG_FILE
  bash "$HERE/cluster/images.sh" trainer torch-trainer operator device-plugin
  # Scrapes what the chart's ServiceMonitors select from here on (the dashboard test reads it).
  bash "$HERE/cluster/prometheus.sh" start
fi
export TRAINYARD_E2E_STATE=$STATE TRAINYARD_KUBELET_ROOT=$KUBELET_ROOT
export PATH=$K8S_BIN:$PATH
# Every pod's log from its start, kept when the pod goes (copied to $logs_to by down.sh).
setsid bash "$HERE/cluster/keep-logs.sh" &
keeper=$!
date +"with-cluster: tests from %T"
"$@"
