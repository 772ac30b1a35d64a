#!/usr/bin/env bash
# The seed loop of `make chaos`, run inside e2e/with-cluster.sh: seeds 1..SEEDS of FAULTS
# faults each (e2e/tests/chaos.rs). Before each seed the API server must answer /readyz
# (it gets 120 s) and every node must be Ready (180 s): a control plane or a node a seed left
# broken is named once and stops the loop, instead of failing every later seed (in seconds
# with "connection refused", or after 180 s waiting for the node).
# Usage: chaos-seeds.sh SEEDS FAULTS (FIRST_SEED=N starts at seed N, to finish a run that was
# stopped: the results are appended to the same results.jsonl)
set -uo pipefail
seeds=${1:?usage: chaos-seeds.sh SEEDS FAULTS}
faults=${2:?usage: chaos-seeds.sh SEEDS FAULTS}
cargo=${CARGO:-cargo}
failed=0
for seed in $(seq "${FIRST_SEED:-1}" "$seeds"); do
  ready=0
  for _ in $(seq 1 120); do
    if kubectl get --raw=/readyz >/dev/null 2>&1; then ready=1; break; fi
    sleep 1
  done
  if [ "$ready" != 1 ]; then
    echo "make chaos: the API server is not ready before seed $seed (120 s); seeds $seed-$seeds not run" >&2
    exit 1
  fi
  if ! kubectl wait --for=condition=Ready node --all --timeout=180s >/dev/null 2>&1; then
    echo "make chaos: a node is not Ready before seed $seed (180 s): $(kubectl get nodes --no-headers 2>&1 | tr -s ' ' | paste -sd ';'); seeds $seed-$seeds not run" >&2
    exit 1
  fi
  date +"make chaos: seed $seed of $seeds from %T"
  TRAINYARD_CHAOS_SEED=$seed TRAINYARD_CHAOS_FAULTS=$faults \
    "$cargo" test -p trainyard-e2e --test chaos -- --ignored --nocapture || failed=1
done
exit $failed
