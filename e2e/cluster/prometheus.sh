#!/usr/bin/env bash
# The e2e's Prometheus (Debian's `prometheus` 2.42), scraping the chart's operator and both
# nodes' device plugins the way the chart's ServiceMonitors tell prometheus-operator to.
#
#   prometheus.sh start    render the chart's ServiceMonitors into $PROM_DIR/prometheus.yml
#                          (prometheus_config.py), check it with promtool, start the endpoints
#                          discovery (prometheus_sd.py) and Prometheus on 127.0.0.1:$PROM_PORT,
#                          and wait until it is ready; idempotent (a running Prometheus
#                          reloads a changed configuration)
#   prometheus.sh stop     stop both by their PID files (down.sh stops them too)
#   prometheus.sh config FILE   only write the configuration to FILE and check it
#
# Both record their PIDs in $PIDS (prometheus, prometheus-sd) and log to $LOGS.
# The configuration is rendered for the release the e2e scenarios install
# (PROM_RELEASE in PROM_RELEASE_NS, values e2e/values-local.yaml).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=env.sh
source "$HERE/env.sh"

PROM_PORT=${TRAINYARD_PROMETHEUS_PORT:-19090}
PROM_DIR=$STATE/prometheus
PROM_RELEASE=trainyard
PROM_RELEASE_NS=trainyard-system
PY=$CACHE/venv/bin/python
# The ServiceMonitors are off by default (they need prometheus-operator's CRDs); the scenarios'
# jobs last tens of seconds, so scrape every 10 s instead of the chart's default 30 s.
PROM_VALUES='{"operator": {"watchNamespace": "trainyard-e2e"},
  "metrics": {"serviceMonitor": {"enabled": true, "interval": "10s", "scrapeTimeout": "5s"}}}'

log() { echo "prometheus: $*"; }
alive() { [[ -f $PIDS/$1.pid ]] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

# write_config FILE SD_DIR RULES_DIR: the configuration, checked by promtool.
write_config() {
  [[ -x $PY ]] || { log "no $PY: run make prereqs" >&2; exit 1; }
  "$PY" "$HERE/prometheus_config.py" scrape-config --release "$PROM_RELEASE" --namespace "$PROM_RELEASE_NS" \
    --values "$ROOT/e2e/values-local.yaml" --set-json "$PROM_VALUES" \
    --sd-dir "$2" --rules-dir "$3" --out "$1"
  promtool check config "$1" >/dev/null
}

# start NAME CMD...: as up.sh's: the program's own PID recorded, output appended to its log.
start() {
  local name=$1; shift
  if alive "$name"; then log "$name already running (pid $(cat "$PIDS/$name.pid"))"; return; fi
  setsid bash -c 'exec "$@"' _ "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name.pid"
  log "started $name (pid $!)"
}

stop() { # stop NAME: SIGTERM, wait up to 10 s, then SIGKILL
  local f=$PIDS/$1.pid pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    log "stopped $1 (pid $pid)"
  fi
  rm -f "$f"
}

start_all() {
  [[ -f $KUBECONFIG_FILE ]] || { log "the cluster is not up ($KUBECONFIG_FILE missing)" >&2; exit 1; }
  mkdir -p "$PROM_DIR/data" "$PROM_DIR/sd" "$LOGS" "$PIDS"
  local config=$PROM_DIR/prometheus.yml before=
  [[ -f $config ]] && before=$(cat "$config")
  write_config "$config" "$PROM_DIR/sd" "$PROM_DIR/rules"
  # The first discovery before Prometheus starts, so that its first scrape finds the targets.
  "$PY" "$HERE/prometheus_sd.py" --config "$config" --kubeconfig "$KUBECONFIG_FILE" --once >/dev/null
  start prometheus-sd "$PY" "$HERE/prometheus_sd.py" --config "$config" --kubeconfig "$KUBECONFIG_FILE"
  if alive prometheus && [[ $before != "$(cat "$config")" ]]; then
    kill -HUP "$(cat "$PIDS/prometheus.pid")" && log "reloaded the changed configuration"
  fi
  start prometheus /usr/bin/prometheus --config.file "$config" --storage.tsdb.path "$PROM_DIR/data" \
    --storage.tsdb.retention.time 2d --web.listen-address "127.0.0.1:$PROM_PORT" \
    --web.console.templates /etc/prometheus/consoles --web.console.libraries /etc/prometheus/console_libraries
  local deadline=$((SECONDS + 60))
  until curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null; do
    alive prometheus || { log "exited; see $LOGS/prometheus.log" >&2; exit 1; }
    ((SECONDS < deadline)) || { log "not ready after 60 s; see $LOGS/prometheus.log" >&2; exit 1; }
    sleep 0.5
  done
  log "ready on http://127.0.0.1:$PROM_PORT"
}

case ${1:-} in
  start) start_all ;;
  stop) stop prometheus; stop prometheus-sd ;;
  config)
    out=${2:?usage: prometheus.sh config FILE}
    write_config "$out" "$(dirname "$out")/sd" "$(dirname "$out")/rules"
    log "wrote $out (promtool: ok)"
    ;;
  *) echo "usage: prometheus.sh start|stop|config FILE" >&2; exit 2 ;;
esac
