#!/usr/bin/env bash
# Keeps the log of every container the local cluster runs, replaced and deleted pods included:
# each second, every log file under both nodes' /var/log/pods gets a hard link under
# $STATE/kept-pods. The kubelet unlinks a deleted pod's files; the link keeps them, with every
# line written until the container closed them. down.sh copies the result beside the other logs.
# Usage: keep-logs.sh (runs until killed; with-cluster.sh starts and stops it by PID).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"

KEEP=$STATE/kept-pods
mkdir -p "$KEEP"

# link_new SRC_ROOT NAME: links every file under SRC_ROOT not linked yet into $KEEP/NAME.
link_new() {
  local root=$1 name=$2 f rel dst
  [[ -d $root ]] || return 0
  while IFS= read -r -d '' f; do
    rel=${f#"$root"/}
    dst=$KEEP/$name/$rel
    # A rotated log is a new file under the old name: it gets a name of its own.
    [[ -e $dst && ! $f -ef $dst ]] && dst=$dst.$(stat -c %i "$f")
    [[ -e $dst ]] && continue
    mkdir -p "$(dirname "$dst")"
    # A hard link needs one filesystem; a copy (refreshed below) is the fallback.
    ln "$f" "$dst" 2>/dev/null || cp "$f" "$dst" 2>/dev/null
  done < <(find "$root" -type f -name '*.log' -print0 2>/dev/null)
}

while true; do
  link_new /var/log/pods node1
  link_new "$NODE2_DIR/private/var/log/pods" node2
  sleep 1
done
