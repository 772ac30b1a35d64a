#!/usr/bin/env bash
# Local STAND-INS for the base images the repository's Dockerfile names. Those images
# cannot be pulled here (no registry is reachable), so the harness builds look-alikes
# under the very same names in buildah's storage, and `buildah bud --pull=never` builds
# the Dockerfile as users build it. They are not the real images:
#   docker.io/library/rust:1.89-bookworm   Debian bookworm minbase (debootstrap) with gcc,
#       libc6-dev and ca-certificates, plus THIS machine's rustup stable toolchain (cargo,
#       rustc, rustdoc and its libraries; no docs) in /usr/local/rustup, with `cargo` on
#       PATH through /usr/local/cargo/bin and CARGO_HOME/RUSTUP_HOME/PATH set as in the
#       official image; and this machine's CA bundle, so that cargo reaches crates.io
#       through whatever TLS proxy the machine trusts. The toolchain's version is the
#       machine's (RUST_VERSION says which), not necessarily 1.89.
#   gcr.io/distroless/cc-debian12:latest   glibc (libc6), libgcc-s1 and ca-certificates
#       unpacked from Debian bookworm packages, /etc/passwd and /etc/group with root and
#       nonroot (65532), /tmp and /home/nonroot; default user 0.
#   gcr.io/distroless/cc-debian12:nonroot  the same files; default user 65532, workdir
#       /home/nonroot.
# The root filesystems are cached under $TRAINYARD_CACHE (default ~/.cache/trainyard) as
# tarballs keyed by a hash of their recipe; an image in buildah's storage whose recipe
# label matches is reused as it is.
#
# Sourced by images.sh (it provides `bh`, buildah with the harness's storage); run on its
# own it builds the three stand-ins: bash e2e/cluster/standins.sh
set -euo pipefail

STANDINS_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=apt-mirror.sh
source "$STANDINS_HERE/apt-mirror.sh"
CACHE=${TRAINYARD_CACHE:-$HOME/.cache/trainyard}
# buildah's image store and the parent of its RUN --mount=type=cache directories (buildah
# puts them under $TMPDIR) live in the cache, so warm runs keep both.
BUILDAH_HOME=$CACHE/buildah
BUILDAH_ROOT=$BUILDAH_HOME/storage
BUILDAH_RUNROOT=/run/trainyard-buildah
BUILDAH_TMP=$BUILDAH_HOME/tmp
STANDIN_WORK=${STANDIN_WORK:-$BUILDAH_HOME/work}

bh() { # buildah on the harness's own vfs store; RUN steps in a chroot
  mkdir -p "$BUILDAH_ROOT" "$BUILDAH_TMP"
  TMPDIR=$BUILDAH_TMP BUILDAH_ISOLATION=chroot \
    buildah --root "$BUILDAH_ROOT" --runroot "$BUILDAH_RUNROOT" --storage-driver vfs "$@"
}

STANDIN_SUITE=bookworm
STANDIN_LABEL=dev.trainyard.stand-in
RUST_STANDIN=docker.io/library/rust:1.89-bookworm
RUST_STANDIN_PACKAGES="gcc libc6-dev ca-certificates"
RUST_STANDIN_RECIPE_VERSION=1
DISTROLESS_STANDIN=gcr.io/distroless/cc-debian12
DISTROLESS_STANDIN_PACKAGES="libc6 libgcc-s1 ca-certificates"
DISTROLESS_STANDIN_RECIPE_VERSION=1
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
RUSTUP_TOOLCHAIN_DIR=${TRAINYARD_RUST_TOOLCHAIN_DIR:-${RUSTUP_HOME:-$HOME/.rustup}/toolchains/stable-x86_64-unknown-linux-gnu}

standin_key() { # standin_key LINE...: a short hash of a recipe
  printf '%s\n' "$@" | sha256sum | cut -c1-16
}

standin_current() { # standin_current IMAGE KEY: true when IMAGE exists with recipe KEY
  local have
  have=$(bh inspect --type image --format "{{index .OCIv1.Config.Labels \"$STANDIN_LABEL\"}}" "$1" 2>/dev/null) || return 1
  [[ $have == "$2" ]]
}

rust_standin_rootfs() { # prints the cached bookworm + gcc root filesystem tarball, building it when missing
  local key tarball fs log mirror
  key=$(standin_key "$RUST_STANDIN_RECIPE_VERSION" "$STANDIN_SUITE" "$RUST_STANDIN_PACKAGES")
  tarball=$CACHE/standin-rust-rootfs-$key.tar
  if [[ -f $tarball ]]; then echo "$tarball"; return; fi
  fs=$STANDIN_WORK/rust-rootfs log=$STANDIN_WORK/rust-rootfs.log
  rm -rf "$fs"; mkdir -p "$fs" "$CACHE"
  echo "standins: rust: debootstrap $STANDIN_SUITE + $RUST_STANDIN_PACKAGES (cached after this run)" >&2
  mirror=$(debian_mirror Debian) || return 1
  debootstrap --variant=minbase "$STANDIN_SUITE" "$fs" "$mirror" >"$log" 2>&1 \
    || { tail -20 "$log" >&2; echo "standins: debootstrap failed (log: $log)" >&2; return 1; }
  cp /etc/resolv.conf "$fs/etc/resolv.conf"
  # apt in the root filesystem, its /proc in a private mount namespace (nothing stays mounted).
  unshare --mount --fork -- sh -ec '
    mount -t proc proc "$1/proc"
    chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -q -y --no-install-recommends $2
    chroot "$1" apt-get clean
  ' sh "$fs" "$RUST_STANDIN_PACKAGES" >>"$log" 2>&1 \
    || { tail -20 "$log" >&2; echo "standins: apt-get install failed (log: $log)" >&2; return 1; }
  rm -rf "$fs"/var/lib/apt/lists/* "$fs"/var/cache/apt/* "$fs"/usr/share/{doc,man,info,locale}/* "$fs/etc/resolv.conf"
  tar -C "$fs" --numeric-owner --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$fs"
  echo "$tarball"
}

standin_from_scratch() { # standin_from_scratch TARBALL: a working container holding TARBALL; prints its name
  local ctr mnt
  ctr=$(bh from scratch)
  mnt=$(bh mount "$ctr")
  tar -C "$mnt" --numeric-owner -xpf "$1"
  echo "$ctr"
}

build_rust_standin() {
  local rootfs toolchain version key ctr mnt tc
  [[ -x $RUSTUP_TOOLCHAIN_DIR/bin/cargo ]] \
    || { echo "standins: no Rust toolchain at $RUSTUP_TOOLCHAIN_DIR (set TRAINYARD_RUST_TOOLCHAIN_DIR)" >&2; return 1; }
  version=$("$RUSTUP_TOOLCHAIN_DIR/bin/rustc" --version | cut -d' ' -f2)
  toolchain=$("$RUSTUP_TOOLCHAIN_DIR/bin/rustc" -vV | sha256sum | cut -c1-16)
  key=$(standin_key "$RUST_STANDIN_RECIPE_VERSION" "$STANDIN_SUITE" "$RUST_STANDIN_PACKAGES" "$toolchain" \
    "$(sha256sum <"$HOST_CA_BUNDLE")")
  if standin_current "$RUST_STANDIN" "$key"; then
    echo "standins: $RUST_STANDIN (stand-in, Rust $version) is current" >&2; return
  fi
  rootfs=$(rust_standin_rootfs)
  echo "standins: $RUST_STANDIN: stand-in from $rootfs + Rust $version" >&2
  ctr=$(standin_from_scratch "$rootfs")
  mnt=$(bh mount "$ctr")
  tc=$mnt/usr/local/rustup/toolchains/stable-x86_64-unknown-linux-gnu
  mkdir -p "$tc/bin" "$mnt/usr/local/cargo/bin"
  cp -a "$RUSTUP_TOOLCHAIN_DIR/lib" "$tc/lib"
  local tool
  for tool in cargo rustc rustdoc; do
    cp -a "$RUSTUP_TOOLCHAIN_DIR/bin/$tool" "$tc/bin/$tool"
    ln -s "../../rustup/toolchains/stable-x86_64-unknown-linux-gnu/bin/$tool" "$mnt/usr/local/cargo/bin/$tool"
  done
  # cargo fetches crates over HTTPS: trust what this machine trusts (a TLS-inspecting
  # proxy's CA included), as a user behind such a proxy adds its CA to the build.
  install -m 0644 "$HOST_CA_BUNDLE" "$mnt/etc/ssl/certs/ca-certificates.crt"
  bh umount "$ctr" >/dev/null
  bh config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env "RUST_VERSION=$version" --cmd '["bash"]' \
    --label "$STANDIN_LABEL=$key" \
    --label "org.opencontainers.image.description=trainyard e2e stand-in for rust:1.89-bookworm (Rust $version)" "$ctr"
  bh commit --rm -q "$ctr" "$RUST_STANDIN" >/dev/null
}

distroless_standin_rootfs() { # prints the cached distroless-like root filesystem tarball
  local versions key tarball fs deb
  versions=$(apt-cache policy $DISTROLESS_STANDIN_PACKAGES | grep -E '^[^ ]|Candidate' | tr -d ' ')
  key=$(standin_key "$DISTROLESS_STANDIN_RECIPE_VERSION" "$DISTROLESS_STANDIN_PACKAGES" "$versions")
  tarball=$CACHE/standin-distroless-rootfs-$key.tar
  if [[ -f $tarball ]]; then echo "$tarball"; return; fi
  fs=$STANDIN_WORK/distroless-rootfs
  rm -rf "$fs" "$STANDIN_WORK/debs"; mkdir -p "$fs" "$STANDIN_WORK/debs" "$CACHE"
  echo "standins: distroless: $DISTROLESS_STANDIN_PACKAGES from Debian packages (cached after this run)" >&2
  (cd "$STANDIN_WORK/debs" && apt-get download -q -o APT::Sandbox::User=root $DISTROLESS_STANDIN_PACKAGES >&2) \
    || { echo "standins: apt-get download $DISTROLESS_STANDIN_PACKAGES failed (apt-get update first?)" >&2; return 1; }
  for deb in "$STANDIN_WORK"/debs/*.deb; do dpkg-deb -x "$deb" "$fs"; done
  rm -rf "$fs"/usr/share/{doc,man,info,locale,lintian} "$STANDIN_WORK/debs"
  # ca-certificates ships the certificates; its postinst (never run here) writes the bundle.
  mkdir -p "$fs/etc/ssl/certs"
  cat "$fs"/usr/share/ca-certificates/mozilla/*.crt >"$fs/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$fs"/{tmp,root,home/nonroot}
  chmod 1777 "$fs/tmp"; chmod 0700 "$fs/root"; chown 65532:65532 "$fs/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$fs/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n' >"$fs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$fs/etc/nsswitch.conf"
  tar -C "$fs" --numeric-owner -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$fs"
  echo "$tarball"
}

build_distroless_standins() {
  local rootfs key ctr tag user workdir
  rootfs=$(distroless_standin_rootfs)
  key=$(standin_key "$DISTROLESS_STANDIN_RECIPE_VERSION" "$(basename "$rootfs")")
  for tag in latest nonroot; do
    if standin_current "$DISTROLESS_STANDIN:$tag" "$key"; then
      echo "standins: $DISTROLESS_STANDIN:$tag (stand-in) is current" >&2; continue
    fi
    user=0 workdir=/
    [[ $tag == nonroot ]] && user=65532 workdir=/home/nonroot
    echo "standins: $DISTROLESS_STANDIN:$tag: stand-in from $rootfs, user $user" >&2
    ctr=$(standin_from_scratch "$rootfs")
    bh umount "$ctr" >/dev/null
    bh config --user "$user" --workingdir "$workdir" \
      --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
      --label "$STANDIN_LABEL=$key" "$ctr"
    bh commit --rm -q "$ctr" "$DISTROLESS_STANDIN:$tag" >/dev/null
  done
}

build_standins() {
  build_distroless_standins
  build_rust_standin
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  build_standins
fi
