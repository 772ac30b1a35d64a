#!/usr/bin/env bash
# make bench: builds the release binaries, runs the operator scale benchmark at the issue's
# sizes and the device plugin's benchmark, and rewrites docs/benchmarks.md with the figures
# (its hand-written analysis below the generated part is kept) and
# target/bench/operator-details.md with each run's detail tables. It also reruns the progress
# channel's load test (in-process, no cluster) into target/bench/progress-load.md, whose table
# is copied by hand into the section "Progress channel: 1,000 reporting ranks".
#
# The local cluster is started when it is not running, and then stopped again afterwards;
# a running cluster is used and left as found. The benchmark's pods never run (they are
# pinned to fake nodes), so no images are needed.
#
# Environment:
#   BENCH_SIZES    JOBSxWORKERSxNODES sizes to run (default "100x4x50 1000x4x500")
#   BENCH_PREEMPT  workers preempted at once per size (default 100, capped at the jobs)
#   BENCH_LIMIT_S  wall-clock limit per size in seconds (default 3600)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=../e2e/cluster/env.sh
source e2e/cluster/env.sh

SIZES=${BENCH_SIZES:-"100x4x50 1000x4x500"}
PREEMPT=${BENCH_PREEMPT:-100}
LIMIT_S=${BENCH_LIMIT_S:-3600}
OUT=$ROOT/target/bench
mkdir -p "$OUT"

echo "bench: building release binaries"
# The operator is built as the Dockerfile builds the image's binaries, together with the
# device plugin: Cargo unifies the features of everything one command builds, so an operator
# built beside the bench is a different binary from the one that ships. Building the bench
# afterwards rebuilds the operator's library for it but leaves that binary as it is.
cargo build --locked --release \
  --package trainyard-operator --bin trainyard-operator \
  --package trainyard-device-plugin --bin trainyard-device-plugin
cargo build --locked --release -p trainyard-bench
BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/trainyard-bench

was_up=0
if [[ ${TRAINYARD_E2E_EXISTING:-0} == 1 ]] ||
   { [[ -f $PIDS/kube-apiserver.pid ]] && kill -0 "$(cat "$PIDS/kube-apiserver.pid")" 2>/dev/null; }; then
  was_up=1
fi
stop_cluster() {
  local rc=$?
  if [[ $was_up == 0 && ${TRAINYARD_E2E_KEEP_UP:-0} != 1 ]]; then
    echo "bench: stopping the cluster this run started"
    bash e2e/cluster/down.sh || true
  fi
  exit $rc
}
trap stop_cluster EXIT INT TERM
if [[ $was_up == 0 ]]; then
  echo "bench: starting the local cluster"
  bash e2e/cluster/up.sh
fi
if [[ ${TRAINYARD_E2E_EXISTING:-0} != 1 ]]; then
  export KUBECONFIG=$KUBECONFIG_FILE
fi
export PATH=$K8S_BIN:$PATH
if ! kubectl get crd trainingjobs.trainyard.dev >/dev/null 2>&1; then
  echo "bench: installing the TrainingJob CRD"
  kubectl apply -f crds/trainingjob.yaml
  kubectl wait --for condition=established --timeout=60s crd/trainingjobs.trainyard.dev
fi

# The device plugin first: its sub-millisecond percentiles need the quietest machine, before
# the operator runs leave the cluster busy cleaning up thousands of pods.
dp=(--device-plugin-missing "device-plugin/benches/grpc.rs does not exist yet")
if [[ -f device-plugin/benches/grpc.rs ]]; then
  echo "bench: device plugin (cargo bench -p trainyard-device-plugin --bench grpc)"
  if cargo bench -p trainyard-device-plugin --bench grpc >"$OUT/device-plugin.md" 2>"$OUT/device-plugin.log"; then
    dp=(--device-plugin "$OUT/device-plugin.md")
  else
    dp=(--device-plugin-missing "cargo bench -p trainyard-device-plugin --bench grpc failed; see target/bench/device-plugin.log")
  fi
fi

# The progress channel at 1,000 reporting ranks: in-process, no cluster; before the operator
# runs for the same reason as the device plugin (its CPU figures want a quiet machine).
progress_load=(--ranks 1000 --jobs 250 --seconds 30 --interval-ms 5000)
echo "bench: progress channel load test (progress-load ${progress_load[*]}); table in $OUT/progress-load.md"
if ! "$BENCH" progress-load "${progress_load[@]}" --json "$OUT/progress-load.json" \
    >"$OUT/progress-load.md" 2>"$OUT/progress-load.log"; then
  echo "bench: the progress load test failed; see target/bench/progress-load.{md,log}" >&2
fi

reports=()
missing=()
for size in $SIZES; do
  IFS=x read -r jobs workers nodes <<<"$size"
  preempt=$((PREEMPT < jobs ? PREEMPT : jobs))
  name="operator-${jobs}x${workers}-on-${nodes}"
  label="$jobs jobs × $workers workers on $nodes nodes"
  echo "bench: $label ($preempt preemptions); log in $OUT/$name.log"
  rm -f "$OUT/$name.json"
  rc=0
  # SIGINT first: the benchmark then cleans up its nodes and namespaces and still writes its report.
  timeout --signal=INT --kill-after=180 "$LIMIT_S" \
    "$BENCH" operator --jobs "$jobs" --workers "$workers" --nodes "$nodes" --preempt "$preempt" \
    --work-dir "$OUT" --json "$OUT/$name.json" >"$OUT/$name.md" 2>"$OUT/$name.log" || rc=$?
  if [[ -s $OUT/$name.json ]]; then
    reports+=(--report "$OUT/$name.json")
    [[ $rc == 0 ]] || echo "bench: $label stopped early (exit $rc); its partial report is kept"
  else
    missing+=(--missing "$label: no report (exit $rc after at most ${LIMIT_S} s); see target/bench/$name.log")
  fi
done

# The page keeps the headline figures; each run's detail tables (CPU by process, API requests
# by verb, every target row) go to the companion file it names.
"$BENCH" render-doc "${reports[@]}" "${missing[@]}" "${dp[@]}" --command "make bench" \
  --doc docs/benchmarks.md --details target/bench/operator-details.md
echo "bench: wrote docs/benchmarks.md and target/bench/operator-details.md"

# The timing guards: each compares two timings of one run and fails when the ratio gets 3x
# worse than recorded. Their verdict moves with the machine's load, which is why they run
# here and not in `make test` (that one guards counts: bench/tests/operator_count_guard.rs).
echo "bench: timing guards (device plugin, operator / floor)"
guards_ok=1
cargo test -p trainyard-device-plugin --features timing-guards --test regression_guard \
  -- --nocapture >"$OUT/guard-device-plugin.log" 2>&1 || guards_ok=0
cargo build -p trainyard-operator
cargo test -p trainyard-bench --features timing-guards --test operator_ratio_guard \
  -- --ignored --nocapture >"$OUT/guard-operator.log" 2>&1 || guards_ok=0
grep -h 'ratio' "$OUT"/guard-*.log || true
if [[ $guards_ok == 0 ]]; then
  echo "bench: a timing guard failed; see target/bench/guard-*.log" >&2
  exit 1
fi
