# shellcheck shell=bash
# What the e2e cluster (up.sh) and the benchmarks' bare control plane (control-plane.sh) build
# alike, so that the two stay the same: the PKI (one CA, a certificate per role), the
# components' kubeconfigs, and the flags of etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler. Sourced; it defines functions only and starts nothing.

# make_cert DIR NAME SUBJ [SAN]: DIR/NAME.{key,csr,ext,crt}, a key and a certificate for both
# server and client use signed by DIR/ca.{crt,key}, with the subject alternative names SAN
# (e.g. "IP:127.0.0.1,DNS:localhost") when given and not empty.
make_cert() (
  set -euo pipefail
  cd "$1"
  openssl req -newkey rsa:2048 -nodes -subj "$3" -keyout "$2.key" -out "$2.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$2.ext"
  if [[ -n ${4:-} ]]; then echo "subjectAltName=$4" >>"$2.ext"; fi
  openssl x509 -req -in "$2.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$2.ext" -out "$2.crt" 2>/dev/null
)

# make_pki DIR CA_CN ADMIN_CN APISERVER_SANS [NAME SUBJ SAN]...: in DIR, a CA (/CN=CA_CN),
# the API server's certificate (/CN=kube-apiserver, SANs APISERVER_SANS), the client
# certificates of admin (/O=system:masters/CN=ADMIN_CN), controller-manager and scheduler, then
# one more certificate per NAME SUBJ SAN triple (SAN "" for none), and the service-account key
# pair sa.{key,pub}. Made once: nothing is done when DIR/ca.crt exists.
make_pki() {
  local dir=$1 ca_cn=$2 admin_cn=$3 apiserver_sans=$4
  shift 4
  if (($# % 3)); then
    echo "make_pki: the extra certificates come as NAME SUBJ SAN triples" >&2
    return 2
  fi
  [[ ! -f $dir/ca.crt ]] || return 0
  mkdir -p "$dir"
  (
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$ca_cn" \
      -keyout ca.key -out ca.crt 2>/dev/null
  )
  make_cert "$dir" apiserver "/CN=kube-apiserver" "$apiserver_sans"
  make_cert "$dir" admin "/O=system:masters/CN=$admin_cn"
  make_cert "$dir" controller-manager "/CN=system:kube-controller-manager"
  make_cert "$dir" scheduler "/CN=system:kube-scheduler"
  while (($#)); do
    make_cert "$dir" "$1" "$2" "$3"
    shift 3
  done
  (
    cd "$dir"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

# write_kubeconfig FILE CLUSTER_NAME SERVER_URL PKI_DIR CERTNAME: a kubeconfig for the cluster
# at SERVER_URL (CA PKI_DIR/ca.crt) as the user CERTNAME (PKI_DIR/CERTNAME.{crt,key}), with
# one context, CLUSTER_NAME, in the default namespace.
write_kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $2
  cluster:
    server: $3
    certificate-authority: $4/ca.crt
users:
- name: $5
  user:
    client-certificate: $4/$5.crt
    client-key: $4/$5.key
contexts:
- name: $2
  context: {cluster: $2, user: $5, namespace: default}
current-context: $2
EOF
}

# The components' flags. Each function sets the array variable named by its first argument (a
# name that does not start with an underscore) to the flags, in their command line's order.

# etcd_flags ARRAY NAME DATA_DIR CLIENT_PORT PEER_PORT: a one-member etcd on loopback (plain
# HTTP), with a 4 GiB backend quota.
etcd_flags() {
  local -n _etcd_out=$1
  _etcd_out=(--name "$2" --data-dir "$3"
    --listen-client-urls "http://127.0.0.1:$4" --advertise-client-urls "http://127.0.0.1:$4"
    --listen-peer-urls "http://127.0.0.1:$5" --initial-advertise-peer-urls "http://127.0.0.1:$5"
    --initial-cluster "$2=http://127.0.0.1:$5" --quota-backend-bytes 4294967296)
}

# apiserver_flags ARRAY PKI_DIR ETCD_PORT SECURE_PORT ADVERTISE_ADDRESS SERVICE_CIDR
#   [KUBELET_CLIENT_CERTNAME]: TLS on 127.0.0.1:SECURE_PORT with PKI_DIR's apiserver, ca and sa
# files, no insecure port, Node+RBAC authorization, the request limits; with
# KUBELET_CLIENT_CERTNAME (for a cluster with nodes), the client certificate it shows the
# kubelets (PKI_DIR/KUBELET_CLIENT_CERTNAME.{crt,key}) and the addresses it reaches them on.
apiserver_flags() {
  local -n _apiserver_out=$1
  local pki=$2 kubelet_client=${7:-}
  _apiserver_out=(--etcd-servers "http://127.0.0.1:$3"
    --bind-address 127.0.0.1 --secure-port "$4" --advertise-address "$5"
    --insecure-port 0
    --authorization-mode "Node,RBAC" --enable-admission-plugins NodeRestriction
    --client-ca-file "$pki/ca.crt"
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key")
  if [[ -n $kubelet_client ]]; then
    _apiserver_out+=(--kubelet-client-certificate "$pki/$kubelet_client.crt"
      --kubelet-client-key "$pki/$kubelet_client.key")
  fi
  _apiserver_out+=(--service-account-key-file "$pki/sa.pub"
    --service-account-signing-key-file "$pki/sa.key"
    --service-account-issuer https://kubernetes.default.svc
    --service-cluster-ip-range "$6" --allow-privileged=true)
  if [[ -n $kubelet_client ]]; then
    _apiserver_out+=(--kubelet-preferred-address-types "InternalIP,Hostname")
  fi
  _apiserver_out+=(--max-requests-inflight 800 --max-mutating-requests-inflight 400
    --profiling=false)
}

# controller_manager_flags ARRAY KUBECONFIG SECURE_PORT PKI_DIR NODE_MONITOR_GRACE_PERIOD:
# the default controllers less nodeipam, cloud-node-lifecycle, route and service, signing with
# PKI_DIR's CA and sa.key, the hostPath provisioner on, no leader election; a silent node's
# grace period NODE_MONITOR_GRACE_PERIOD ("" for the default), its pods evicted after 5 min.
controller_manager_flags() {
  local -n _controller_manager_out=$1
  local pki=$4
  _controller_manager_out=(--kubeconfig "$2"
    --authentication-kubeconfig "$2" --authorization-kubeconfig "$2"
    --bind-address 127.0.0.1 --port 0 --secure-port "$3"
    --use-service-account-credentials
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt"
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
    --enable-hostpath-provisioner --leader-elect=false
    --controllers '*,-nodeipam,-cloud-node-lifecycle,-route,-service')
  if [[ -n $5 ]]; then
    _controller_manager_out+=(--node-monitor-grace-period "$5")
  fi
  _controller_manager_out+=(--pod-eviction-timeout 5m)
}

# scheduler_flags ARRAY KUBECONFIG SECURE_PORT: no leader election.
scheduler_flags() {
  local -n _scheduler_out=$1
  _scheduler_out=(--kubeconfig "$2"
    --authentication-kubeconfig "$2" --authorization-kubeconfig "$2"
    --bind-address 127.0.0.1 --port 0 --secure-port "$3" --leader-elect=false)
}
