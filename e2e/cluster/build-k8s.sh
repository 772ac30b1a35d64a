#!/usr/bin/env bash
# Builds Kubernetes 1.20.2 (Debian's source package, Debian's Go) into a cache
# outside the repository. Idempotent: a second run with a complete cache is a no-op.
#
#   TRAINYARD_CACHE   cache root (default ~/.cache/trainyard)
set -euo pipefail

CACHE=${TRAINYARD_CACHE:-$HOME/.cache/trainyard}
K8S_DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
BIN=$CACHE/k8s-1.20.2/bin
WHAT=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl kube-proxy)
STAMP=$BIN/.complete-$K8S_DEB_VERSION-reflect2fix-proxy

if [[ -f $STAMP ]]; then
  echo "build-k8s: cached in $BIN"
  exit 0
fi

SRC_ROOT=$CACHE/k8s-1.20.2/src
mkdir -p "$SRC_ROOT" "$BIN"

# 1. Debian source package (needs a deb-src entry).
if ! ls "$SRC_ROOT"/kubernetes-*/Makefile >/dev/null 2>&1; then
  if ! apt-get indextargets 2>/dev/null | grep -q 'Created-By: Sources'; then
    # The source entries of the machine's own binary sources (its mirror or proxy).
    # shellcheck source=apt-mirror.sh
    source "$(dirname "$0")/apt-mirror.sh"
    archive=$(debian_mirror Debian)
    security=$(debian_mirror Debian-Security)
    cat > /etc/apt/sources.list.d/trainyard-deb-src.sources <<SRC
Types: deb-src
URIs: $archive
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
  fi
  (cd "$SRC_ROOT" && apt-get source -qq "kubernetes=$K8S_DEB_VERSION")
fi
TREE=$(ls -d "$SRC_ROOT"/kubernetes-*/ | head -1)
TREE=${TREE%/}

# 2. reflect2 v1.0.1 (vendored) calls reflect.mapiterinit with the pre-Go-1.18
#    signature; with Go >= 1.18 the runtime writes into a too-small iterator and
#    the apiserver/kubelet die with SIGSEGV in mapiterinit. Apply the shape of
#    the v1.0.2 fix: an out-parameter and the runtime's full hiter layout.
python3 "$(dirname "$0")/patch-reflect2.py" "$TREE/vendor/github.com/modern-go/reflect2"

# 3. Build the way Debian's rules file does: GOPATH with k8s.io/kubernetes -> tree.
export GOPATH=$CACHE/k8s-1.20.2/gopath
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$TREE" "$GOPATH/src/k8s.io/kubernetes"
export GOCACHE=$CACHE/k8s-1.20.2/gocache
export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
targets=()
for w in "${WHAT[@]}"; do targets+=("cmd/$w"); done
echo "build-k8s: building ${WHAT[*]} (about 10 minutes on 2 cores)"
(cd "$GOPATH/src/k8s.io/kubernetes" && make WHAT="${targets[*]}" GOFLAGS=-mod=vendor)
for w in "${WHAT[@]}"; do
  install -m 0755 "$TREE/_output/local/bin/linux/$(go env GOARCH)/$w" "$BIN/$w"
done
touch "$STAMP"
echo "build-k8s: done -> $BIN"
