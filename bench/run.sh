#!/usr/bin/env bash
# make bench: builds the release binaries, runs the operator scale benchmark several times at
# each judged size and once at each size of the memory slope, each run on a fresh control plane,
# and the device plugin's benchmark, and rewrites docs/benchmarks.md with the figures (its
# hand-written analysis below the generated part is kept) and target/bench/operator-details.md
# with each run's figures and detail tables. It also reruns the progress channel's load test
# (in-process, no cluster) into target/bench/progress-load.md, whose table is copied by hand
# into the section "Progress channel: 1,000 reporting ranks".
#
# Every operator run gets a control plane of its own (e2e/cluster/control-plane.sh: etcd with an
# empty data directory, the API server, controller-manager and scheduler; no kubelet, since the
# benchmark's pods are pinned to fake nodes and never run), stopped again after it, so that no
# run inherits another's objects or a busy etcd. The local e2e cluster is neither needed nor
# touched. With TRAINYARD_E2E_EXISTING=1 every run uses the cluster KUBECONFIG names instead,
# one after the other on the same cluster.
#
# Environment:
#   BENCH_RUNS       the judged sizes, JOBSxWORKERSxNODES*RUNS (default "100x4x50*3 1000x4x500*3"):
#                    each size RUNS times; the page shows every run and judges the targets on
#                    each size's worst. Reports: target/bench/operator-<J>x<W>-on-<N>-run<K>.json
#   BENCH_SLOPE      further sizes for the page's "Memory by size" table, JOBSxWORKERSxNODES, one
#                    run each (default "250x4x125 500x4x250 2000x4x1000"; "" for none); the table
#                    fits the slope over these and the judged sizes' worst runs.
#                    Reports: target/bench/operator-<J>x<W>-on-<N>-slope.json
#   BENCH_PREEMPT    workers preempted at once per run (default 100, capped at the jobs)
#   BENCH_LIMIT_S    wall-clock limit per run in seconds (default 3600)
#   BENCH_PORT_BASE  the control plane's first port (default 27443; it takes five)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

RUNS=${BENCH_RUNS-"100x4x50*3 1000x4x500*3"}
SLOPE=${BENCH_SLOPE-"250x4x125 500x4x250 2000x4x1000"}
PREEMPT=${BENCH_PREEMPT:-100}
LIMIT_S=${BENCH_LIMIT_S:-3600}
PORT_BASE=${BENCH_PORT_BASE:-27443}
EXISTING=${TRAINYARD_E2E_EXISTING:-0}
OUT=$ROOT/target/bench
CONTROL_PLANE=$OUT/control-plane
mkdir -p "$OUT"

# parse_size SPEC: "JOBS WORKERS NODES RUNS" from JOBSxWORKERSxNODES[*RUNS], or fails.
parse_size() {
  [[ $1 =~ ^([0-9]+)x([0-9]+)x([0-9]+)(\*([0-9]+))?$ ]] || {
    echo "bench: '$1' is not JOBSxWORKERSxNODES[*RUNS]" >&2
    return 1
  }
  echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]} ${BASH_REMATCH[3]} ${BASH_REMATCH[5]:-1}"
}
# Read without globbing: "100x4x50*3" is no file pattern.
read -ra run_specs <<<"$RUNS"
read -ra slope_specs <<<"$SLOPE"
for spec in "${run_specs[@]}" "${slope_specs[@]}"; do parse_size "$spec" >/dev/null; done
if [[ $EXISTING == 1 ]]; then
  : "${KUBECONFIG:?TRAINYARD_E2E_EXISTING=1 needs KUBECONFIG}"
fi

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

# control_plane up|down: the fresh control plane of one run (nothing with an existing
# cluster); its output goes to target/bench/control-plane.log.
control_plane() {
  [[ $EXISTING == 1 ]] && return 0
  bash e2e/cluster/control-plane.sh "$1" "$CONTROL_PLANE" ${2:+"$2"} >>"$OUT/control-plane.log" 2>&1
}
# What a run's clients are given: the control plane's kubeconfig, and its directory as the
# harness state, where the benchmark's CPU profile finds the control plane's PID files.
cluster_env=()
if [[ $EXISTING != 1 ]]; then
  cluster_env=(KUBECONFIG="$CONTROL_PLANE/kubeconfig" TRAINYARD_E2E_STATE="$CONTROL_PLANE")
fi
stop_control_plane() {
  local rc=$?
  control_plane down || echo "bench: stopping the control plane in $CONTROL_PLANE failed; see $OUT/control-plane.log" >&2
  exit $rc
}
trap stop_control_plane EXIT INT TERM
: >"$OUT/control-plane.log"

# The device plugin first: its sub-millisecond percentiles need the quietest machine.
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

render=()
# operator_run KIND NAME LABEL JOBS WORKERS NODES: one run of the operator benchmark on a fresh
# control plane; its report goes to render-doc as --KIND (report or slope-report), or why there
# is none as --missing or --slope-missing.
operator_run() {
  local kind=$1 name=$2 label=$3 jobs=$4 workers=$5 nodes=$6 rc=0
  local preempt=$((PREEMPT < jobs ? PREEMPT : jobs))
  local missing=--missing
  [[ $kind == report ]] || missing=--slope-missing
  echo "bench: $label ($preempt preemptions); log in $OUT/$name.log"
  rm -f "$OUT/$name.json"
  if ! control_plane up "$PORT_BASE"; then
    render+=("$missing" "$label: the control plane did not start; see target/bench/control-plane.log")
    control_plane down || true
    return 0
  fi
  # SIGINT first: the benchmark then cleans up its nodes and namespaces and still writes its report.
  timeout --signal=INT --kill-after=180 "$LIMIT_S" env "${cluster_env[@]}" \
    "$BENCH" operator --jobs "$jobs" --workers "$workers" --nodes "$nodes" --preempt "$preempt" \
    --work-dir "$OUT" --json "$OUT/$name.json" >"$OUT/$name.md" 2>"$OUT/$name.log" || rc=$?
  control_plane down || echo "bench: stopping the control plane failed; see target/bench/control-plane.log" >&2
  if [[ -s $OUT/$name.json ]]; then
    render+=("--$kind" "$OUT/$name.json")
    [[ $rc == 0 ]] || echo "bench: $label stopped early (exit $rc); its partial report is kept"
  else
    render+=("$missing" "$label: no report (exit $rc after at most ${LIMIT_S} s); see target/bench/$name.log")
  fi
}

for spec in "${run_specs[@]}"; do
  read -r jobs workers nodes runs <<<"$(parse_size "$spec")"
  for ((k = 1; k <= runs; k++)); do
    operator_run report "operator-${jobs}x${workers}-on-${nodes}-run$k" \
      "$jobs jobs × $workers workers on $nodes nodes, run $k of $runs" "$jobs" "$workers" "$nodes"
  done
done
for spec in "${slope_specs[@]}"; do
  read -r jobs workers nodes _ <<<"$(parse_size "$spec")"
  operator_run slope-report "operator-${jobs}x${workers}-on-${nodes}-slope" \
    "$jobs jobs × $workers workers on $nodes nodes (memory slope)" "$jobs" "$workers" "$nodes"
done

# The page keeps each size's runs, their worst and the memory by size; each run's figures and
# detail tables (CPU by process, API requests by verb, every target row) go to the companion
# file it names.
"$BENCH" render-doc "${render[@]}" "${dp[@]}" --command "make bench" \
  --doc docs/benchmarks.md --details target/bench/operator-details.md
echo "bench: wrote docs/benchmarks.md and target/bench/operator-details.md"

# The timing guards: each compares two timings of one run and fails when the ratio gets 3x
# worse than recorded. Their verdict moves with the machine's load, which is why they run
# here and not in `make test` (that one guards counts: bench/tests/operator_count_guard.rs).
# The operator's runs on a fresh control plane of its own, as the benchmark's do.
echo "bench: timing guards (device plugin, operator / floor)"
guards_ok=1
cargo test -p trainyard-device-plugin --features timing-guards --test regression_guard \
  -- --nocapture >"$OUT/guard-device-plugin.log" 2>&1 || guards_ok=0
cargo build -p trainyard-operator
if control_plane up "$PORT_BASE"; then
  env "${cluster_env[@]}" cargo test -p trainyard-bench --features timing-guards --test operator_ratio_guard \
    -- --ignored --nocapture >"$OUT/guard-operator.log" 2>&1 || guards_ok=0
else
  echo "bench: the control plane for the operator's guard did not start; see target/bench/control-plane.log" >"$OUT/guard-operator.log"
  guards_ok=0
fi
control_plane down || true
grep -h 'ratio' "$OUT"/guard-*.log || true

# Make before break on a termination notice against in place and recreate: the three restarts
# of the same torchrun job in each of BENCH_NOTICE_ROUNDS rounds (default 3; 0 skips it), on
# the local e2e cluster (built and started as make test does), all in this one run. The table
# lands in target/bench/make-before-break.md and is copied by hand into the page's section.
NOTICE_ROUNDS=${BENCH_NOTICE_ROUNDS:-3}
if [[ $NOTICE_ROUNDS != 0 ]]; then
  echo "bench: make before break, $NOTICE_ROUNDS round(s) on the local cluster"
  cargo build --workspace --bins
  FIGURE_ROUNDS=$NOTICE_ROUNDS bash e2e/with-cluster.sh bash -c \
    'kubectl cordon trainyard-node-2 >/dev/null &&
     cargo test -p trainyard-e2e --test scenarios -- --ignored --exact --nocapture figures_make_before_break_against_in_place_and_recreate' \
    >"$OUT/make-before-break.log" 2>&1 || guards_ok=0
  cat "$OUT/make-before-break.md" 2>/dev/null || echo "bench: no make-before-break table; see target/bench/make-before-break.log" >&2
fi
if [[ $guards_ok == 0 ]]; then
  echo "bench: a timing guard failed; see target/bench/guard-*.log" >&2
  exit 1
fi
