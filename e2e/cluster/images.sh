#!/usr/bin/env bash
# Builds the e2e images without a registry or Docker engine and imports them
# into the harness's containerd (namespace k8s.io):
#   pause          docker.io/trainyard/pause:dev          static pause binary
#   trainer        docker.io/trainyard/trainer:dev        busybox (for shell trainers)
#   operator       docker.io/trainyard/operator:dev       the Dockerfile's `operator` target, built
#                  by buildah on the stand-in base images of standins.sh
#   device-plugin  docker.io/trainyard/device-plugin:dev  the Dockerfile's `device-plugin` target, likewise
#   torch-trainer  docker.io/trainyard/torch-trainer:dev  Debian bookworm (debootstrap) with
#                  python3-torch (CPU, gloo, torchrun) and examples/train.py as /app/train.py,
#                  with the modules it imports beside it: the checkpoint fence
#                  (examples/trainyard_fence.py), SIGTERM (examples/trainyard_sigterm.py) and
#                  elastic sizes (examples/trainyard_elastic.py),
#                  and the container's first process (examples/trainyard_launch.py);
#                  and torchrun starting workers in new sessions (e2e/torchrun_new_sessions.py)
# Every image goes into node 1's containerd and, when it runs, node 2's.
# usage: images.sh [pause|trainer|operator|device-plugin|torch-trainer|all|inputs|push]...
# (`inputs`: only the cached PyTorch layer and the stand-in base images, nothing imported)
# The operator and device-plugin images come from the Dockerfile as users build it (a
# release build in the build stage; its cargo caches are buildah cache mounts kept in
# $TRAINYARD_CACHE/buildah), and their config is checked against the chart after the build.
# The PyTorch layer (about 1 GiB unpacked, minutes to build) is cached under
# $TRAINYARD_CACHE (default ~/.cache/trainyard), keyed by a hash of its recipe.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=env.sh
source "$HERE/env.sh"
# shellcheck source=standins.sh
source "$HERE/standins.sh"
# shellcheck source=apt-mirror.sh
source "$HERE/apt-mirror.sh"
WORK=$STATE/images
mkdir -p "$WORK"

import() { # import TAR: into every running node's containerd
  local sock
  for sock in "$CONTAINERD_SOCK" "$NODE2_CONTAINERD_SOCK"; do
    [[ -S $sock ]] || continue
    /usr/bin/ctr --address "$sock" -n k8s.io images import --no-unpack=false "$1" >/dev/null
  done
}

base_rootfs() { # base_rootfs DIR: /etc/passwd with a nonroot user, /tmp
  rm -rf "$1"; mkdir -p "$1"/{etc,tmp,usr/local/bin}
  chmod 1777 "$1/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$1/etc/group"
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

# The operator and the device plugin from the repository's Dockerfile, built as users build
# it (both targets, cache mounts, --pull=never) by buildah on the stand-in base images of
# standins.sh. `buildah inspect` of each image is kept beside its tar for
# charts/tests/check_image_config.py, which compares it with the chart before the image is
# imported.
STANDINS_READY=0
build_dockerfile_image() { # build_dockerfile_image TARGET
  local image=docker.io/trainyard/$1:dev log=$WORK/$1-build.log
  if ((!STANDINS_READY)); then build_standins; STANDINS_READY=1; fi
  echo "images: $1: buildah bud --target $1 (the Dockerfile; log: $log)" >&2
  bh bud --isolation chroot --pull=never --target "$1" -t "$image" -f "$ROOT/Dockerfile" "$ROOT" >"$log" 2>&1 \
    || { tail -30 "$log" >&2; echo "images: building $1 from the Dockerfile failed (log: $log)" >&2; exit 1; }
  bh inspect --type image "$image" >"$WORK/$1.inspect.json"
  check_image_config "$1"
  rm -f "$WORK/$1.tar"
  bh push -q "$image" "docker-archive:$WORK/$1.tar:$image" >/dev/null
  # The image this build replaced is untagged now: drop it (a vfs image is a full copy).
  bh rmi --prune >/dev/null 2>&1 || true
  import "$WORK/$1.tar"
}

check_image_config() { # check_image_config TARGET: the built image's config against the chart
  local pytest=$CACHE/venv/bin/pytest
  [[ -x $pytest ]] || { echo "images: no $pytest (make prereqs)" >&2; exit 1; }
  TRAINYARD_IMAGE_CONFIG_DIR=$WORK TRAINYARD_CHECK_IMAGES=$1 \
    "$pytest" -q -p no:cacheprovider "$ROOT/charts/tests/check_image_config.py" >&2 \
    || { echo "images: the $1 image built from the Dockerfile does not match the chart" >&2; exit 1; }
}

# The recipe of the cached PyTorch layer: change it and the hash (so the cache) changes.
TORCH_SUITE=bookworm
TORCH_PACKAGES="python3-torch"
TORCH_RECIPE_VERSION=1
CACHE=${TRAINYARD_CACHE:-$HOME/.cache/trainyard}

torch_base_layer() { # prints the path of the cached layer, building it when missing
  local key layer fs
  key=$(printf '%s\n' "$TORCH_RECIPE_VERSION" "$TORCH_SUITE" "$TORCH_PACKAGES" | sha256sum | cut -c1-16)
  layer=$CACHE/torch-base-$key.layer.tar
  if [[ -f $layer ]]; then
    echo "images: torch-trainer: cached PyTorch layer $layer" >&2
    echo "$layer"; return
  fi
  fs=$WORK/torch-base-rootfs
  rm -rf "$fs"; mkdir -p "$CACHE"
  echo "images: torch-trainer: debootstrap $TORCH_SUITE + $TORCH_PACKAGES (cached after this run)" >&2
  local mirror
  mirror=$(debian_mirror Debian) || exit 1
  debootstrap --variant=minbase "$TORCH_SUITE" "$fs" "$mirror" >"$WORK/torch-debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/torch-debootstrap.log" >&2; echo "images: debootstrap failed (log: $WORK/torch-debootstrap.log)" >&2; exit 1; }
  cp /etc/resolv.conf "$fs/etc/resolv.conf"
  # apt inside the root filesystem, with its own /proc in a private mount namespace so
  # nothing stays mounted on the host if this is interrupted.
  unshare --mount --fork -- sh -ec '
    mount -t proc proc "$1/proc"
    chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -q -y --no-install-recommends $2
    chroot "$1" apt-get clean
  ' sh "$fs" "$TORCH_PACKAGES" >>"$WORK/torch-debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/torch-debootstrap.log" >&2; echo "images: apt-get install $TORCH_PACKAGES failed (log: $WORK/torch-debootstrap.log)" >&2; exit 1; }
  chroot "$fs" python3 -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' \
    || { echo "images: torch in the new root filesystem has no gloo" >&2; exit 1; }
  rm -rf "$fs"/var/lib/apt/lists/* "$fs"/var/cache/apt/* "$fs"/usr/share/{doc,man,info,locale}/* "$fs/etc/resolv.conf"
  python3 "$HERE/mkimage.py" --layer-only "$fs" "$layer" >&2
  rm -rf "$fs"
  echo "$layer"
}

build_torch_trainer() {
  local base fs=$WORK/torch-trainer-rootfs
  base=$(torch_base_layer)
  rm -rf "$fs"; mkdir -p "$fs/app"
  install -m 0644 "$ROOT/examples/train.py" "$fs/app/train.py"
  install -m 0644 "$ROOT/examples/trainyard_fence.py" "$fs/app/trainyard_fence.py"
  install -m 0644 "$ROOT/examples/trainyard_sigterm.py" "$fs/app/trainyard_sigterm.py"
  install -m 0644 "$ROOT/examples/trainyard_elastic.py" "$fs/app/trainyard_elastic.py"
  install -m 0644 "$ROOT/examples/trainyard_launch.py" "$fs/app/trainyard_launch.py"
  # torchrun with every worker in a session of its own, as torch >= 2.1 starts them (the
  # chaos run's job: e2e/torchrun_new_sessions.py).
  install -m 0644 "$ROOT/e2e/torchrun_new_sessions.py" "$fs/app/torchrun_new_sessions.py"
  # PET_REDIRECTS/PET_TEE: torch 1.13's torchrun on Python 3.11 crashes in to_map unless
  # both are set (its Std lookup misses the zero value); 1 = stdout only, so logs still flow.
  python3 "$HERE/mkimage.py" "$fs" trainyard/torch-trainer:dev "$WORK/torch-trainer.tar" \
    --base-layer "$base" --workdir /app \
    --env PYTHONUNBUFFERED=1 --env PET_REDIRECTS=1 --env PET_TEE=1 \
    --cmd '["python3", "/app/trainyard_launch.py", "torchrun", "/app/train.py"]'
  import "$WORK/torch-trainer.tar"
}

# ---------- push: the release images, for a real cluster ----------
# `images.sh push` (make images REGISTRY=...) builds the Dockerfile's operator and device-plugin
# targets on the real base images, pulled (never the stand-ins above), tags them
# $REGISTRY/trainyard-operator:$VERSION and $REGISTRY/trainyard-device-plugin:$VERSION, pushes
# them, and prints each digest and the chart values that pin them (also written to
# target/images/image-values.yaml). It runs no cluster and imports nothing.
#   REGISTRY   required, e.g. registry.example.com/trainyard (log in with your engine first)
#   VERSION    the tag; default: the chart's appVersion where HEAD is its clean release tag
#              (v<appVersion>), else `git describe --tags --always --dirty`
#   ENGINE     docker, podman or buildah; default: docker when its daemon answers, else
#              podman, else buildah
#   PULL       the base images' pull policy: always (default), missing or never
#   DRY_RUN=1  prints each engine command instead of running it
#   PUSH_TO    a directory: writes each image there as an OCI archive instead of pushing it
#              (podman and buildah; to try the step without a registry)
release_version() { # the default VERSION
  local app
  app=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$ROOT/charts/trainyard/Chart.yaml")
  if git -C "$ROOT" describe --tags --exact-match --match "v$app" >/dev/null 2>&1 \
    && [[ -z $(git -C "$ROOT" status --porcelain --untracked-files=no) ]]; then
    echo "$app"
  else
    git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo "$app"
  fi
}

release_engine() { # the engine to build and push with
  if [[ -n ${ENGINE:-} ]]; then echo "$ENGINE"; return; fi
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker; return; fi
  local e
  for e in podman buildah; do
    if command -v "$e" >/dev/null; then echo "$e"; return; fi
  done
  echo "images: push: no container engine (docker with a running daemon, podman or buildah)" >&2
  return 1
}

engine() { # engine ARGS...: runs the engine, or prints the command under DRY_RUN
  if [[ -n ${DRY_RUN:-} ]]; then printf '%q ' "$RELEASE_ENGINE" "$@" >&2; echo >&2; return; fi
  if [[ $RELEASE_ENGINE == docker ]]; then DOCKER_BUILDKIT=1 docker "$@"; else "$RELEASE_ENGINE" "$@"; fi
}

release_build() { # release_build TARGET REF
  local pull=()
  case $RELEASE_ENGINE:$PULL in
    docker:always) pull=(--pull) ;;
    docker:*) ;;
    *) pull=("--pull=$PULL") ;;
  esac
  echo "images: push: $1: $RELEASE_ENGINE build --target $1 (base images: pull $PULL)" >&2
  local verb=build
  [[ $RELEASE_ENGINE == buildah ]] && verb=bud
  engine "$verb" "${pull[@]}" --target "$1" -t "$2" -f "$ROOT/Dockerfile" "$ROOT"
  [[ -n ${DRY_RUN:-} ]] && return
  local label
  case $RELEASE_ENGINE in
    docker) label=$(docker image inspect --format "{{index .Config.Labels \"$STANDIN_LABEL\"}}" "$2") ;;
    podman) label=$(podman image inspect --format "{{index .Labels \"$STANDIN_LABEL\"}}" "$2") ;;
    *) label=$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$STANDIN_LABEL\"}}" "$2") ;;
  esac
  if [[ -n $label && $label != "<no value>" ]]; then
    echo "images: push: $2 is built on the e2e harness's stand-in base images ($STANDIN_LABEL=$label);" \
      "refusing to push it (remove the stand-ins from this engine's store, or PULL=always)" >&2
    exit 1
  fi
}

release_push() { # release_push REF: pushes REF, prints its digest
  local digest_file=$RELEASE_WORK/digest dest=docker://$1
  rm -f "$digest_file"
  if [[ -n ${PUSH_TO:-} ]]; then
    [[ $RELEASE_ENGINE != docker ]] || { echo "images: push: PUSH_TO needs podman or buildah" >&2; exit 2; }
    mkdir -p "$PUSH_TO"
    local name=${1##*/}
    dest=oci-archive:$PUSH_TO/${name%%:*}.tar:$1
  fi
  echo "images: push: $1 -> $dest" >&2
  case $RELEASE_ENGINE in
    docker) engine push "$1" >&2 ;;
    *) engine push --digestfile "$digest_file" "$1" "$dest" ;;
  esac
  if [[ -n ${DRY_RUN:-} ]]; then echo "sha256:dry-run"; return; fi
  if [[ $RELEASE_ENGINE == docker ]]; then
    docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$1" \
      | sed -n "s|^${1%:*}@||p" | head -1 >"$digest_file"
  fi
  local digest
  digest=$(cat "$digest_file" 2>/dev/null || true)
  [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] \
    || { echo "images: push: no digest for $1 (got '$digest')" >&2; exit 1; }
  echo "$digest"
}

push_release_images() {
  [[ -n ${REGISTRY:-} ]] || { echo "images: push: set REGISTRY (e.g. registry.example.com/trainyard)" >&2; exit 2; }
  local registry=${REGISTRY%/} version=${VERSION:-}
  [[ $registry != *://* && $registry != *@* ]] \
    || { echo "images: push: REGISTRY is a repository prefix without scheme or tag: $REGISTRY" >&2; exit 2; }
  [[ -n $version ]] || version=$(release_version)
  [[ $version =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] \
    || { echo "images: push: VERSION is not a valid image tag: $version" >&2; exit 2; }
  PULL=${PULL:-always}
  [[ $PULL =~ ^(always|missing|never)$ ]] || { echo "images: push: PULL is always, missing or never" >&2; exit 2; }
  RELEASE_ENGINE=$(release_engine)
  [[ $RELEASE_ENGINE =~ ^(docker|podman|buildah)$ ]] \
    || { echo "images: push: ENGINE is docker, podman or buildah, not $RELEASE_ENGINE" >&2; exit 2; }
  RELEASE_WORK=$ROOT/target/images
  mkdir -p "$RELEASE_WORK"
  local t ref repo digest values=$RELEASE_WORK/image-values.yaml
  declare -A repos digests
  for t in operator device-plugin; do
    repo=$registry/trainyard-$t ref=$registry/trainyard-$t:$version
    release_build "$t" "$ref"
    digest=$(release_push "$ref")
    echo "images: push: $repo:$version@$digest" >&2
    repos[$t]=$repo digests[$t]=$digest
  done
  {
    echo "# make images REGISTRY=$registry VERSION=$version ($RELEASE_ENGINE)"
    echo "operator:"
    echo "  image:"
    echo "    repository: ${repos[operator]}"
    echo "    tag: \"$version\""
    echo "    digest: ${digests[operator]}"
    echo "devicePlugin:"
    echo "  image:"
    echo "    repository: ${repos[device-plugin]}"
    echo "    tag: \"$version\""
    echo "    digest: ${digests[device-plugin]}"
  } >"$values"
  echo "images: push: the chart values that pin these images (also in $values):" >&2
  cat "$values"
  echo "images: push: helm install trainyard charts/trainyard -n trainyard-system --create-namespace" \
    "-f $values -f my-values.yaml" >&2
}

targets=("$@")
((${#targets[@]})) || targets=(all)
for t in "${targets[@]}"; do
  case $t in
    pause) build_pause ;;
    trainer) build_trainer ;;
    operator) build_dockerfile_image operator ;;
    device-plugin) build_dockerfile_image device-plugin ;;
    torch-trainer) build_torch_trainer ;;
    push) push_release_images ;;
    # What a warm cache keeps and no cluster is needed for (make cluster-inputs).
    inputs) torch_base_layer >/dev/null; build_standins ;;
    all) build_pause; build_trainer; build_dockerfile_image operator; build_dockerfile_image device-plugin
         build_torch_trainer ;;
    *) echo "images: unknown image $t" >&2; exit 2 ;;
  esac
done
