#!/usr/bin/env bash
# A real Kubernetes 1.20.2 control plane (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager) for integration tests, built from Debian bookworm's
# `kubernetes` source package. See /work/shared/reference/control-plane.md.
#
# Usage:
#   cluster.sh install              build/cache the binaries (idempotent); prints the bin dir
#   cluster.sh start DIR            start a fresh cluster living in DIR; prints DIR/admin.kubeconfig
#   cluster.sh stop DIR [--purge]   stop it (idempotent); --purge also deletes DIR
#   cluster.sh status DIR           exit 0 iff the cluster's apiserver answers /readyz
#   cluster.sh kubectl              build/cache a kubectl of the same version; prints its path
#
# Environment: RUNPOD_KUBELET_CACHE (default ~/.cache/runpod-kubelet),
#              CLUSTER_START_TIMEOUT (seconds, default 90),
#              EXTRA_APISERVER_FLAGS, EXTRA_CONTROLLER_MANAGER_FLAGS (whitespace-separated flags
#              appended to that component's command line, e.g. shorter eviction timeouts;
#              `{pki}` stands for the cluster's PKI directory).
# Progress and errors go to stderr; stdout carries only the final line.
set -euo pipefail

K8S_VERSION=1.20.2
CACHE="${RUNPOD_KUBELET_CACHE:-$HOME/.cache/runpod-kubelet}/k8s-$K8S_VERSION"
BIN="$CACHE/bin"
COMPONENTS=(kube-apiserver kube-scheduler kube-controller-manager)
# Written to $BIN/BUILD_REV; bump it when the build recipe changes so stale caches rebuild.
BUILD_REV="1.20.2+reflect2-1.0.2+version"
ETCD=/usr/bin/etcd
GOROOT_DEBIAN=/usr/lib/go-1.19

log() { echo "[cluster] $*" >&2; }
die() { echo "[cluster] ERROR: $*" >&2; exit 1; }

have_binaries() {
  local c
  for c in "${COMPONENTS[@]}"; do [[ -x "$BIN/$c" ]] || return 1; done
  [[ $(cat "$BIN/BUILD_REV" 2>/dev/null) == "$BUILD_REV" ]]
}

# apt-get install only the packages that are not installed yet.
# apt's chatter goes to a log that is shown only on failure.
APT_LOG=/tmp/runpod-kubelet-apt.log
apt_run() { "$@" >>"$APT_LOG" 2>&1 || { tail -n 20 "$APT_LOG" >&2; die "failed: $*"; }; }
APT_UPDATED=
apt_update() { [[ -n $APT_UPDATED ]] || { log "apt-get update"; apt_run apt-get update; APT_UPDATED=1; }; }
ensure_pkgs() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing packages (${missing[*]}); run 'cluster.sh install' as root"
  apt_update
  log "apt-get install ${missing[*]}"
  apt_run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# `apt-get source` needs a deb-src entry: copy the first `Types: deb` stanza of
# debian.sources (deb822 format) as `Types: deb-src` for the `bookworm` suite.
ensure_deb_src() {
  if grep -rqsE '^(Types:.*deb-src|deb-src[[:space:]])' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    return 0
  fi
  local src=/etc/apt/sources.list.d/debian.sources
  [[ -f $src ]] || die "no deb-src entry and no $src to derive one from"
  log "adding deb-src stanza (/etc/apt/sources.list.d/debian-src.sources)"
  awk 'BEGIN { RS = ""; ORS = "\n" }
       NR == 1 { n = split($0, l, "\n")
                 for (i = 1; i <= n; i++) {
                   if (l[i] ~ /^Types:/) l[i] = "Types: deb-src"
                   else if (l[i] ~ /^Suites:/) l[i] = "Suites: bookworm"
                   print l[i] } }' "$src" >/etc/apt/sources.list.d/debian-src.sources
  APT_UPDATED=
  apt_update
}

# build_binaries [OUT_DIR REV COMPONENT...]: defaults to the control plane into $BIN.
build_binaries() {
  local out="${1:-$BIN}" rev="${2:-$BUILD_REV}"
  local components=("${@:3}")
  ((${#components[@]})) || components=("${COMPONENTS[@]}")
  ensure_pkgs golang-1.19-go rsync dpkg-dev make golang-github-modern-go-reflect2-dev
  ensure_deb_src

  local scratch="$CACHE/build-$(basename "$out")" src_dir="$CACHE/src"
  mkdir -p "$scratch" "$src_dir"

  # The 34 MB source download is kept in the cache so a failed build does not redo it.
  if ! compgen -G "$src_dir/kubernetes_*.orig.tar.*" >/dev/null; then
    log "downloading the kubernetes source package (apt-get source)"
    apt_update
    (cd "$src_dir" && apt_run apt-get source --download-only kubernetes)
  fi
  local tarball
  tarball=$(compgen -G "$src_dir/kubernetes_*.orig.tar.*" | head -n1)

  # GOPATH mode: module mode fails on this tree ("updates to go.mod needed").
  local gopath="$scratch/gopath" tree="$scratch/gopath/src/k8s.io/kubernetes"
  rm -rf "$gopath"
  mkdir -p "$tree"
  log "unpacking $(basename "$tarball")"
  tar -xf "$tarball" -C "$tree" --strip-components=1
  # The vendored github.com/modern-go/reflect2 v1.0.1 is broken under Go >= 1.18: the
  # apiserver panics (nil pointer in reflect2.Type2) decoding every JSON Pod body, so
  # kubectl and kube-rs cannot create pods. v1.0.2 fixes it; Debian ships it.
  local reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
  rm -rf "$tree/vendor/github.com/modern-go/reflect2"
  cp -r "$reflect2" "$tree/vendor/github.com/modern-go/reflect2"

  export GOPATH="$gopath" GO111MODULE=off CGO_ENABLED=0 GOFLAGS='' \
         GOCACHE="$scratch/gocache" PATH="$GOROOT_DEBIAN/bin:$PATH"
  local buildlog="$scratch/build.log"
  : >"$buildlog"
  # The orig tarball lacks the generated OpenAPI definitions
  # (otherwise: undefined: openapi.GetOpenAPIDefinitions).
  log "make gen_openapi (log: $buildlog)"
  (cd "$tree" && make gen_openapi) >>"$buildlog" 2>&1 || { tail -n 30 "$buildlog" >&2; die "make gen_openapi failed"; }

  # The version every path may read it from (the vendored and the module path of component-base
  # and client-go): /version must say v1.20.2 as a released apiserver does (Helm checks the
  # chart's kubeVersion against it), not the source tarball's v0.0.0-master.
  local ldflags="-s -w" v
  for v in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/component-base/version \
    k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=20 -X $v.gitTreeState=clean"
  done
  local tmp="$out.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "go build ${components[*]} (several minutes on 2 cores)"
  (cd "$tree" && go build -ldflags "$ldflags" -o "$tmp/" "${components[@]/#/./cmd/}") >>"$buildlog" 2>&1 \
    || { rm -rf "$tmp"; tail -n 30 "$buildlog" >&2; die "go build failed"; }

  # Directory rename: other processes see either no bin dir or a complete one.
  echo "$rev" >"$tmp/BUILD_REV"
  rm -rf "$out"
  mv "$tmp" "$out"
  rm -rf "$scratch"
  log "built: $("$out/${components[0]}" --version 2>&1 | head -n1)"
}

# kubectl for the demo, built from the same source (not needed by the tests).
KUBECTL_DIR="$CACHE/kubectl"
cmd_kubectl() {
  if [[ ! -x $KUBECTL_DIR/kubectl || $(cat "$KUBECTL_DIR/BUILD_REV" 2>/dev/null) != "$BUILD_REV" ]]; then
    mkdir -p "$CACHE"
    exec 8>"$CACHE/.kubectl.lock"
    flock 8
    if [[ ! -x $KUBECTL_DIR/kubectl || $(cat "$KUBECTL_DIR/BUILD_REV" 2>/dev/null) != "$BUILD_REV" ]]; then
      build_binaries "$KUBECTL_DIR" "$BUILD_REV" kubectl
    fi
  fi
  echo "$KUBECTL_DIR/kubectl"
}

cmd_install() {
  ensure_pkgs etcd-server openssl curl
  if ! have_binaries; then
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock -n 9 || { log "another install is building; waiting for $CACHE/.lock"; flock 9; }
    # Another install may have finished while we waited.
    if have_binaries; then
      log "binaries appeared while waiting"
    else
      local t0=$SECONDS
      build_binaries
      log "build took $((SECONDS - t0)) s"
    fi
    exec 9>&-
  fi
  log "binaries ready in $BIN"
  echo "$BIN"
}

# ---------------------------------------------------------------- cluster

# pid of a component if its process is alive and really belongs to DIR (pid reuse guard).
# Whether a component we just spawned is still running. Unlike live_pid (which guards kill
# against pid reuse by matching the command line) this never mistakes a starting process for a
# dead one: the pid file may not be written yet, and /proc/PID/cmdline reads empty while the
# process is in the middle of exec.
running_pid() {
  local f="$1" pid
  [[ -s $f ]] || return 0
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  [[ -r /proc/$pid/status ]] || return 1
  ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"
}

live_pid() {
  local f="$1" pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/" || return 1
  echo "$pid"
}

# Running and not a zombie (our daemons are reparented to PID 1, which may reap late).
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && ${st:0:1} != Z ]]
}

running_pids() {
  local f
  for f in "$DIR"/pids/*.pid; do
    if [[ -e $f ]]; then live_pid "$f" || true; fi
  done
}

# A port is taken if something accepts a connection on it. Ports are drawn
# below the kernel's ephemeral range so outgoing connections cannot grab them,
# from 15000 to 24000: the tests draw theirs from 24000 up (tests/support/webhook.rs),
# so a port drawn here but not bound yet is not drawn by a test too.
USED_PORTS=" "
free_port() { # VAR: assigns a free port to VAR
  local lo _hi p i top=24000
  read -r lo _hi </proc/sys/net/ipv4/ip_local_port_range || true
  if ((${lo:-32768} < top)); then top=$lo; fi
  # An ephemeral range that starts this low leaves nothing below it.
  if ((top <= 15100)); then top=24000; fi
  for ((i = 0; i < 200; i++)); do
    p=$((15000 + (RANDOM * 32768 + RANDOM) % (top - 15000)))
    [[ $USED_PORTS == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then
      USED_PORTS+="$p "
      printf -v "$1" %s "$p"
      return 0
    fi
  done
  die "no free port found"
}

make_pki() {
  local pki="$DIR/pki"
  mkdir -p "$pki"
  # rustls rejects X.509 v1 certificates: every certificate, CA included, is v3 with extensions.
  cat >"$pki/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = IP:127.0.0.1, IP:10.96.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
  local o=(-config "$pki/openssl.cnf")
  openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 3650 "${o[@]}" -extensions ca \
    -subj "/CN=runpod-kubelet-test-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  # name  subject  extension-section
  local spec name subj ext
  for spec in "apiserver|/CN=kube-apiserver|server" \
              "admin|/O=system:masters/CN=admin|client" \
              "scheduler|/CN=system:kube-scheduler|client" \
              "controller-manager|/CN=system:kube-controller-manager|client" \
              "apiserver-kubelet-client|/O=system:masters/CN=kube-apiserver-kubelet-client|client"; do
    IFS='|' read -r name subj ext <<<"$spec"
    openssl req -new -nodes -newkey rsa:2048 "${o[@]}" -subj "$subj" \
      -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
    openssl x509 -req -sha256 -days 3650 -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -set_serial "0x$(openssl rand -hex 16)" -extfile "$pki/openssl.cnf" -extensions "$ext" \
      -out "$pki/$name.crt" 2>/dev/null
  done
  rm -f "$pki"/*.csr
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

# kubeconfig NAME CERT-BASENAME: certificate data embedded, so the file is self-contained.
make_kubeconfig() {
  local pki="$DIR/pki"
  cat >"$DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$pki/$2.crt")
    client-key-data: $(base64 -w0 "$pki/$2.key")
contexts:
- name: test
  context: {cluster: test, user: $2}
current-context: test
EOF
}

# Start NAME CMD... in its own session (setsid: survives the caller and its
# process group), stdin/stdout/stderr detached so a caller reading our stdout
# is not kept waiting. The inner shell writes its own pid (atomically: a watcher must never
# read a half-written pid file and take the component for dead), then execs.
spawn() {
  local name="$1"; shift
  # shellcheck disable=SC2016 # $$ and $@ belong to the inner shell
  setsid bash -c 'echo $$ >"$1.tmp" && mv "$1.tmp" "$1"; shift; exec "$@"' _ "$DIR/pids/$name.pid" "$@" \
    </dev/null >"$DIR/logs/$name.log" 2>&1 &
}

api() { # PATH -> body on stdout; fails on HTTP errors
  curl -sf --max-time 5 --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT$1"
}

fail_start() {
  local f
  echo "[cluster] ERROR: $*" >&2
  for f in "$DIR"/logs/*.log; do
    echo "----- tail of $f" >&2
    tail -n 20 "$f" >&2
  done
  cmd_stop >/dev/null
  exit 1
}

# wait_for DESCRIPTION COMMAND...: poll until COMMAND succeeds or the deadline passes.
wait_for() {
  local what="$1"; shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < DEADLINE)) || fail_start "timed out waiting for $what"
    local f
    for f in "$DIR"/pids/*.pid; do
      [[ -e $f ]] || continue
      running_pid "$f" || fail_start "$(basename "$f" .pid) exited while waiting for $what"
    done
    sleep 0.5
  done
  log "$what: ok ($((SECONDS - START)) s)"
}

# Probes, called through wait_for.
readyz_ok() { [[ $(api /readyz) == ok ]]; }
# shellcheck disable=SC2317
default_sa_ok() { api /api/v1/namespaces/default/serviceaccounts/default | grep -q '"secrets"'; }
# shellcheck disable=SC2317
healthz_ok() { [[ $(curl -skf --max-time 5 "https://127.0.0.1:$1/healthz") == ok ]]; }

cmd_start() {
  [[ -n ${DIR:-} ]] || die "usage: cluster.sh start DIR"
  if ! have_binaries || [[ ! -x $ETCD ]]; then
    log "binaries missing in $BIN: running 'cluster.sh install' first"
    bash "${BASH_SOURCE[0]}" install >/dev/null   # separate process: its lock fd is not inherited
  fi
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd -P)
  [[ -z $(running_pids) ]] || die "$DIR already holds a running cluster (cluster.sh stop $DIR)"
  # Fresh state; only remove what this script creates.
  rm -rf "$DIR/etcd" "$DIR/pki" "$DIR/pids" "$DIR/logs" "$DIR/env" "$DIR"/*.kubeconfig
  mkdir -p "$DIR/pids" "$DIR/logs"
  START=$SECONDS
  DEADLINE=$((SECONDS + ${CLUSTER_START_TIMEOUT:-90}))

  local v
  for v in ETCD_PORT ETCD_PEER_PORT APISERVER_PORT SCHEDULER_PORT CONTROLLER_MANAGER_PORT; do free_port "$v"; done
  log "ports: etcd $ETCD_PORT/$ETCD_PEER_PORT apiserver $APISERVER_PORT scheduler $SCHEDULER_PORT controller-manager $CONTROLLER_MANAGER_PORT"

  make_pki
  make_kubeconfig admin admin
  make_kubeconfig scheduler scheduler
  make_kubeconfig controller-manager controller-manager
  cat >"$DIR/env" <<EOF
KUBECONFIG=$DIR/admin.kubeconfig
APISERVER_URL=https://127.0.0.1:$APISERVER_PORT
APISERVER_PORT=$APISERVER_PORT
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
SCHEDULER_PORT=$SCHEDULER_PORT
CONTROLLER_MANAGER_PORT=$CONTROLLER_MANAGER_PORT
EOF

  local peer="http://127.0.0.1:$ETCD_PEER_PORT" client="http://127.0.0.1:$ETCD_PORT"
  spawn etcd "$ETCD" --name default --data-dir "$DIR/etcd" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "default=$peer"
  wait_for "etcd /health" curl -sf --max-time 2 "$client/health"

  local pki="$DIR/pki" extra_apiserver=() extra_controller_manager=()
  read -r -a extra_apiserver <<<"${EXTRA_APISERVER_FLAGS:-}"
  read -r -a extra_controller_manager <<<"${EXTRA_CONTROLLER_MANAGER_FLAGS:-}"
  # {pki} in an extra flag is this cluster's PKI directory (e.g. the cluster CA for
  # --kubelet-certificate-authority={pki}/ca.crt).
  if ((${#extra_apiserver[@]})); then extra_apiserver=("${extra_apiserver[@]//\{pki\}/$pki}"); fi
  if ((${#extra_controller_manager[@]})); then
    extra_controller_manager=("${extra_controller_manager[@]//\{pki\}/$pki}")
  fi
  spawn kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="$client" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
    --cert-dir="$pki" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --authorization-mode=Node,RBAC --service-cluster-ip-range=10.96.0.0/16 \
    --allow-privileged=true ${extra_apiserver[@]+"${extra_apiserver[@]}"}
  wait_for "kube-apiserver /readyz" readyz_ok

  # --port=0 turns off the insecure 10251/10252 ports, which would clash between clusters.
  local common=(--authentication-kubeconfig="$DIR/CONF.kubeconfig" --authorization-kubeconfig="$DIR/CONF.kubeconfig"
                --kubeconfig="$DIR/CONF.kubeconfig" --bind-address=127.0.0.1 --port=0 --leader-elect=false)
  spawn kube-scheduler "$BIN/kube-scheduler" "${common[@]//CONF/scheduler}" \
    --secure-port="$SCHEDULER_PORT" --cert-dir="$pki/scheduler"
  # nodeipam needs a cluster CIDR and is useless without a CNI; the node lifecycle
  # controller stays on (it removes the not-ready taint of Ready nodes).
  spawn kube-controller-manager "$BIN/kube-controller-manager" "${common[@]//CONF/controller-manager}" \
    --secure-port="$CONTROLLER_MANAGER_PORT" --cert-dir="$pki/controller-manager" \
    --controllers='*,-nodeipam' --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    ${extra_controller_manager[@]+"${extra_controller_manager[@]}"}

  wait_for "kube-scheduler /healthz" healthz_ok "$SCHEDULER_PORT"
  wait_for "kube-controller-manager /healthz" healthz_ok "$CONTROLLER_MANAGER_PORT"
  # Pods are rejected until the default ServiceAccount and its token secret exist.
  wait_for "default ServiceAccount with token" default_sa_ok
  log "cluster usable after $((SECONDS - START)) s"
  echo "$DIR/admin.kubeconfig"
}

# TERM the given components, wait up to 10 s, then KILL what is left.
stop_group() {
  local name pid pids=() left i
  for name in "$@"; do
    if pid=$(live_pid "$DIR/pids/$name.pid"); then pids+=("$pid"); fi
  done
  ((${#pids[@]})) || return 0
  log "stopping $* (${pids[*]})"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    left=()
    for pid in "${pids[@]}"; do alive "$pid" && left+=("$pid"); done
    ((${#left[@]})) || return 0
    sleep 0.1
  done
  log "killing ${left[*]} (still running after 10 s)"
  kill -KILL "${left[@]}" 2>/dev/null || true
}

cmd_stop() {
  [[ -d ${DIR:-} ]] || return 0
  DIR=$(cd "$DIR" && pwd -P)
  # Reverse dependency order: the apiserver hangs on shutdown once etcd is gone.
  stop_group kube-scheduler kube-controller-manager
  stop_group kube-apiserver
  stop_group etcd
  rm -f "$DIR"/pids/*.pid
  if [[ $PURGE == 1 ]]; then
    rm -rf "$DIR"
  fi
  return 0
}

cmd_status() {
  [[ -f ${DIR:-}/env ]] || exit 1
  DIR=$(cd "$DIR" && pwd -P)
  APISERVER_PORT=$(sed -n 's/^APISERVER_PORT=//p' "$DIR/env")
  readyz_ok
}

main() {
  local cmd="${1:-}" a
  [[ $# -gt 0 ]] && shift
  for a in "$@"; do
    case $a in
      --purge) PURGE=1 ;;
      *) [[ -z $DIR ]] || die "unexpected argument: $a"; DIR=$a ;;
    esac
  done
  case $cmd in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    kubectl) cmd_kubectl ;;
    *) sed -n '6,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
}

PURGE=0
DIR=
# On one line with exit: bash never reads past it, so editing this file while it runs is safe.
main "$@"; exit
