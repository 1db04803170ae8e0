#!/usr/bin/env bash
# The local demo: a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager 1.20.2), the RunPod simulator standing in for RunPod, the
# runpod-kubelet admission webhook over TLS and the runpod-kubelet controller (the virtual
# kubelet). A plain GPU Job in a labelled namespace bursts to "RunPod", runs and completes; a pod
# asking for a forbidden datacenter is refused at admission.
#
#   scripts/demo.sh               run it and tear everything down
#   scripts/demo.sh --keep        leave everything running until Ctrl-C
#   scripts/demo.sh --real-runpod use the real RunPod (needs RUNPOD_API_KEY; bills your account)
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
real=0
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --real-runpod) real=1 ;;
    *) echo "usage: $0 [--keep] [--real-runpod]" >&2; exit 2 ;;
  esac
done
if ((real)) && [[ -z "${RUNPOD_API_KEY:-}" ]]; then
  echo "--real-runpod needs RUNPOD_API_KEY in the environment" >&2; exit 2
fi
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

WITH_FUZZ=0 bash scripts/prerequisites.sh
step "Building runpod-kubelet"
cargo build --quiet
bin="$PWD/target/debug/runpod-kubelet"

work="$(mktemp -d /tmp/runpod-kubelet-demo.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  bash tests/control-plane/cluster.sh stop "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if ! command -v kubectl >/dev/null 2>&1; then
  step "Building kubectl $(sed -n 's/^K8S_VERSION=//p' tests/control-plane/cluster.sh) (once; cached)"
  kubectl_bin="$(bash tests/control-plane/cluster.sh kubectl)"
  export PATH="$(dirname "$kubectl_bin"):$PATH"
fi

step "Starting the control plane"
KUBECONFIG="$(bash tests/control-plane/cluster.sh start "$work/cluster")"
export KUBECONFIG
kubectl get --raw /readyz >/dev/null && echo "kube-apiserver ready ($KUBECONFIG)"

step "Registering a local node with one GPU (a stand-in: no kubelet runs here)"
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
cat <<JSON | kubectl create -f - >/dev/null
{"apiVersion": "v1", "kind": "Node",
 "metadata": {"name": "local-gpu", "labels": {"kubernetes.io/hostname": "local-gpu", "kubernetes.io/os": "linux"}},
 "status": {
   "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1"},
   "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1"},
   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "demo",
                   "lastHeartbeatTime": "$(now)", "lastTransitionTime": "$(now)"}]}}
JSON
# Keep its Lease fresh, as a kubelet would, so the node lifecycle controller keeps it Ready.
(
  while true; do
    micro="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
    kubectl apply -f - >/dev/null 2>&1 <<JSON || true
{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
 "metadata": {"name": "local-gpu", "namespace": "kube-node-lease"},
 "spec": {"holderIdentity": "local-gpu", "leaseDurationSeconds": 40, "renewTime": "$micro"}}
JSON
    sleep 10
  done
) &
pids+=($!)

if ((real)); then
  step "Using the real RunPod API (RUNPOD_API_KEY is set; pods created here are billed)"
  runpod_url_args=()
else
  step "Starting the RunPod simulator (RunPod cannot be reached from here)"
  export RUNPOD_API_KEY="demo-key-$RANDOM$RANDOM"
  cat >"$work/scenario.json" <<'JSON'
{"provisioning_ms": 2000, "starting_ms": 2000, "ports_ms": 1000,
 "images": [{"match": "pytorch", "outcome": "EXITED", "after_ms": 8000, "exit_code": 0,
             "logs": ["loading data", "epoch 1/2 loss=0.71", "epoch 2/2 loss=0.42", "saved model.pt"]}]}
JSON
  "$bin" simulator --listen 127.0.0.1:0 --scenario "$work/scenario.json" \
    >"$work/simulator.out" 2>"$work/simulator.log" &
  pids+=($!)
  for _ in $(seq 1 50); do grep -q listening "$work/simulator.out" 2>/dev/null && break; sleep 0.2; done
  sim_url="$(sed -n 's/^runpod simulator listening on //p' "$work/simulator.out")"
  [[ -n "$sim_url" ]] || { echo "the simulator did not start:"; cat "$work/simulator.log"; exit 1; }
  echo "simulator: $sim_url"
  runpod_url_args=(--runpod-api-url "$sim_url")
fi

step "Starting the controller: it registers node virtual-runpod and runs its pods on RunPod"
kubelet_port=$((30000 + RANDOM % 5000))
while (exec 3<>"/dev/tcp/127.0.0.1/$kubelet_port") 2>/dev/null; do kubelet_port=$((kubelet_port + 1)); done
metrics_port=$((kubelet_port + 1))
"$bin" controller --nodename virtual-runpod "${runpod_url_args[@]}" \
  --kubelet-port "$kubelet_port" --kubelet-client-ca "$work/cluster/pki/ca.crt" \
  --metrics-listen "127.0.0.1:$metrics_port" \
  --datacenter-ids EU-RO-1,US-TX-3 --max-gpu-price 1.0 --reconcile-interval 2s \
  >"$work/controller.log" 2>&1 &
pids+=($!)
echo "controller: $bin controller --nodename virtual-runpod ${runpod_url_args[*]} --kubelet-port $kubelet_port ..."
for _ in $(seq 1 150); do
  kubectl get node virtual-runpod >/dev/null 2>&1 && break
  sleep 0.2
done
kubectl wait --for=condition=Ready node/virtual-runpod --timeout=60s >/dev/null || {
  echo "the virtual node did not become Ready:"; tail -30 "$work/controller.log"; exit 1; }
run kubectl get nodes -L type,virtual-kubelet.io/provider

step "Starting the webhook (TLS, certificates from 'runpod-kubelet certs')"
run "$bin" certs --out-dir "$work/certs" --log-level warn
port=$((20000 + RANDOM % 10000))
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
"$bin" webhook --listen "127.0.0.1:$port" \
  --tls-cert "$work/certs/tls.crt" --tls-key "$work/certs/tls.key" \
  --datacenter-ids EU-RO-1,US-TX-3 --max-gpu-price 1.0 >"$work/webhook.log" 2>&1 &
pids+=($!)
echo "webhook: $bin webhook --listen 127.0.0.1:$port --datacenter-ids EU-RO-1,US-TX-3 ..."
for _ in $(seq 1 100); do
  curl -sf --cacert "$work/certs/ca.crt" "https://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.2
done
curl -sf --cacert "$work/certs/ca.crt" "https://127.0.0.1:$port/readyz" >/dev/null || {
  echo "the webhook did not become ready:"; cat "$work/webhook.log"; exit 1; }
"$bin" webhook-configuration --url "https://127.0.0.1:$port/mutate" --ca-bundle "$work/certs/ca.crt" \
  | kubectl apply -f -

step "Opting in namespace 'demo'"
run kubectl create namespace demo
run kubectl label namespace demo runpod.io/burst=enabled
until kubectl -n demo get serviceaccount default >/dev/null 2>&1; do sleep 0.5; done

step "Submitting a plain GPU Job: 2 GPUs, nothing about RunPod in it (the local node has 1)"
cat <<'YAML' | tee "$work/job.yaml"
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: demo}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime
        command: ["python", "train.py", "--epochs", "2"]
        ports: [{containerPort: 8888}]
        resources: {limits: {nvidia.com/gpu: 2}}
YAML
kubectl apply -f "$work/job.yaml"

step "What the webhook added to the pod"
for _ in $(seq 1 120); do
  pod="$(kubectl -n demo get pods -l job-name=train -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)"
  [[ -n "$pod" ]] && break
  sleep 0.5
done
kubectl -n demo get pod "$pod" -o go-template='pod {{.metadata.name}}
  tolerations: {{range .spec.tolerations}}{{if .key}}{{.key}}={{.value}}:{{.effect}} {{end}}{{end}}
  preferred node affinity: {{range .spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution}}weight {{.weight}}: {{range .preference.matchExpressions}}{{.key}} {{.operator}} {{.values}}{{end}}{{end}}
'

step "The scheduler sends it to virtual-runpod; the controller creates its RunPod pod"
for _ in $(seq 1 240); do
  [[ -n "$(kubectl -n demo get pod "$pod" -o jsonpath='{.metadata.annotations.runpod\.io/pod-id}')" ]] && break
  sleep 0.5
done
run kubectl -n demo get pod "$pod" -o wide
kubectl -n demo get pod "$pod" -o go-template='  RunPod pod {{index .metadata.annotations "runpod.io/pod-id"}}: {{index .metadata.annotations "runpod.io/gpu-type"}} in {{index .metadata.annotations "runpod.io/datacenter"}}, {{index .metadata.annotations "runpod.io/cost-per-hr"}} USD/h
'

step "Waiting for the Job to complete on RunPod"
if ! kubectl -n demo wait --for=condition=complete job/train --timeout=300s; then
  echo "the Job did not complete:"; kubectl -n demo describe pod "$pod" | tail -20
  tail -30 "$work/controller.log"; exit 1
fi
run kubectl -n demo get pod "$pod" -o jsonpath='{.status.phase} (exit code {.status.containerStatuses[0].state.terminated.exitCode}){"\n"}'

step "kubectl logs, streamed from RunPod through the controller's kubelet API"
run kubectl -n demo logs "$pod"

step "Events of the pod"
kubectl -n demo get events --field-selector "involvedObject.name=$pod" \
  -o custom-columns=REASON:.reason,MESSAGE:.message --sort-by=.lastTimestamp

if ((!real)); then
  step "The simulator's ledger: one RunPod pod, terminated when the pod finished"
  curl -s "$sim_url/_sim/ledger" | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    state = "terminated" if e.get("terminated_at") else "STILL BILLING"
    print("  %s  %s  %s  %s" % (e["id"], e.get("gpu_id"), e.get("data_center_id"), state))'
fi

step "A pod asking for a datacenter this cluster forbids"
cat <<'YAML' | tee "$work/forbidden.yaml"
apiVersion: v1
kind: Pod
metadata:
  name: us-west-only
  namespace: demo
  annotations: {runpod.io/datacenter-ids: "US-CA-2"}
spec:
  containers:
  - {name: main, image: pytorch/pytorch, resources: {limits: {nvidia.com/gpu: 1}}}
YAML
if kubectl apply -f "$work/forbidden.yaml"; then
  echo "unexpected: the pod was admitted"; exit 1
fi

step "Metrics"
curl -s --cacert "$work/certs/ca.crt" "https://127.0.0.1:$port/metrics" | grep '^runpod_kubelet_admissions_total'
curl -s "http://127.0.0.1:$metrics_port/metrics" | grep -E '^runpod_kubelet_(runpod_calls_total|pods_by_state|cost_per_hour)' | head -12 || true

if ((keep)); then
  step "Still running (KUBECONFIG=$KUBECONFIG); Ctrl-C to stop"
  wait
fi
