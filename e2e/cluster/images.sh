#!/usr/bin/env bash
# Builds the e2e images without a registry or Docker engine and imports them
# into the harness's containerd (namespace k8s.io):
#   pause          docker.io/trainyard/pause:dev          static pause binary
#   trainer        docker.io/trainyard/trainer:dev        busybox (for shell trainers)
#   operator       docker.io/trainyard/operator:dev       binary + the libraries ldd lists
#   device-plugin  docker.io/trainyard/device-plugin:dev  likewise
# usage: images.sh [pause|trainer|operator|device-plugin|all]...
# TRAINYARD_BIN_DIR selects the cargo output dir (default: target/debug).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=env.sh
source "$HERE/env.sh"
BIN_DIR=${TRAINYARD_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/debug}
WORK=$STATE/images
mkdir -p "$WORK"

import() { # import TAR
  /usr/bin/ctr --address "$CONTAINERD_SOCK" -n k8s.io images import --no-unpack=false "$1" >/dev/null
}

base_rootfs() { # base_rootfs DIR: /etc/passwd with a nonroot user, /tmp
  rm -rf "$1"; mkdir -p "$1"/{etc,tmp,usr/local/bin}
  chmod 1777 "$1/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$1/etc/group"
}

copy_with_libs() { # copy_with_libs BINARY ROOTFS
  install -D -m 0755 "$1" "$2/usr/local/bin/$(basename "$1")"
  ldd "$1" | grep -o '/[^ ]*' | sort -u | while read -r lib; do
    install -D -m 0755 "$(readlink -f "$lib")" "$2$lib"
  done
}

build_pause() {
  local fs=$WORK/pause-rootfs
  base_rootfs "$fs"
  gcc -static -O2 -o "$fs/pause" "$HERE/pause.c"
  python3 "$HERE/mkimage.py" "$fs" trainyard/pause:dev "$WORK/pause.tar" --entrypoint '["/pause"]'
  import "$WORK/pause.tar"
}

build_trainer() {
  local fs=$WORK/trainer-rootfs
  base_rootfs "$fs"
  mkdir -p "$fs/bin"
  cp /bin/busybox "$fs/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ $applet == busybox ]] || ln -sf busybox "$fs/bin/$applet"
  done
  python3 "$HERE/mkimage.py" "$fs" trainyard/trainer:dev "$WORK/trainer.tar" --cmd '["/bin/sh"]'
  import "$WORK/trainer.tar"
}

build_binary_image() { # build_binary_image NAME USER
  local bin=$BIN_DIR/trainyard-$1 fs=$WORK/$1-rootfs
  [[ -x $bin ]] || { echo "images: $bin not built (cargo build --workspace --bins)" >&2; exit 1; }
  base_rootfs "$fs"
  copy_with_libs "$bin" "$fs"
  python3 "$HERE/mkimage.py" "$fs" "trainyard/$1:dev" "$WORK/$1.tar" \
    --entrypoint "[\"/usr/local/bin/trainyard-$1\"]" --user "$2"
  import "$WORK/$1.tar"
}

targets=("$@")
((${#targets[@]})) || targets=(all)
for t in "${targets[@]}"; do
  case $t in
    pause) build_pause ;;
    trainer) build_trainer ;;
    operator) build_binary_image operator 65532 ;;
    device-plugin) build_binary_image device-plugin 0 ;;
    all) build_pause; build_trainer; build_binary_image operator 65532; build_binary_image device-plugin 0 ;;
    *) echo "images: unknown image $t" >&2; exit 2 ;;
  esac
done
