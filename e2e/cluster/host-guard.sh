#!/usr/bin/env bash
# Checks that the local cluster leaves the host's own services alone. `start`, before the
# harness: a stand-in listens wherever a host's containerd, etcd or Prometheus would (their
# default socket and ports) unless something already does. `check`, after it: every stand-in
# (or service found there) still answers; the stand-ins are then stopped, by PID.
# usage: host-guard.sh start|check
set -uo pipefail
GUARD=${TRAINYARD_HOST_GUARD_DIR:-/tmp/trainyard-host-guard}
CONTAINERD_DEFAULT=/run/containerd/containerd.sock
PORTS=(2379 9090) # etcd's client port, Prometheus'

# answers TARGET: whether a unix socket path or a 127.0.0.1 port accepts a connection.
answers() {
  python3 - "$1" <<'EOF'
import socket, sys
target = sys.argv[1]
try:
    if target.startswith("/"):
        s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(target)
    else:
        s = socket.create_connection(("127.0.0.1", int(target)), timeout=2)
    s.close()
except OSError:
    sys.exit(1)
EOF
}

# stand_in TARGET NAME: a listener that accepts and closes, in the background; its PID kept.
stand_in() {
  python3 - "$1" <<'EOF' >/dev/null 2>&1 &
import os, socket, sys
target = sys.argv[1]
if target.startswith("/"):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    s = socket.socket(socket.AF_UNIX); s.bind(target)
else:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(target)))
s.listen(16)
while True:
    c, _ = s.accept(); c.close()
EOF
  echo $! >"$GUARD/$2.pid"
  echo "$1" >"$GUARD/$2.target"
}

start() {
  rm -rf "$GUARD"; mkdir -p "$GUARD"
  local target name
  for target in "$CONTAINERD_DEFAULT" "${PORTS[@]}"; do
    name=$(basename "$target")
    if answers "$target"; then
      echo "$target" >"$GUARD/$name.found" # the host's own: it must still answer after
      echo "host-guard: $target is the host's own; it must still answer afterwards"
    elif [[ ! -e $target ]] || [[ $target != /* ]]; then
      stand_in "$target" "$name"
      for _ in $(seq 1 20); do answers "$target" && break; sleep 0.1; done
      echo "host-guard: a stand-in listens on $target"
    fi
  done
}

check() {
  local rc=0 f target pid
  for f in "$GUARD"/*.target "$GUARD"/*.found; do
    [[ -e $f ]] || continue
    target=$(cat "$f")
    if answers "$target"; then
      echo "host-guard: $target still answers"
    else
      echo "host-guard: $target no longer answers: the local cluster touched a host service" >&2
      rc=1
    fi
  done
  for f in "$GUARD"/*.pid; do
    [[ -e $f ]] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null
    target=$(cat "${f%.pid}.target")
    [[ $target == /* ]] && rm -f "$target"
  done
  rm -rf "$GUARD"
  return $rc
}

case ${1:-} in
  start) start ;;
  check) check ;;
  *) echo "usage: host-guard.sh start|check" >&2; exit 2 ;;
esac
