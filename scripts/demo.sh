#!/usr/bin/env bash
# The local demo: a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager 1.20.2), the runpod-kubelet admission webhook over TLS, a labelled
# namespace, a plain GPU Job and a pod asking for a forbidden datacenter. It shows how the Job's
# pods were mutated, where the scheduler put them, and the refusal.
#
# The controller that runs pods on RunPod is not part of the project yet: the virtual node is
# registered here the way the controller will register it, and the RunPod side is shown as the
# placement candidates the RunPod client computes from the simulator's catalogue. `--keep` leaves everything running
# until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
[[ "${1:-}" == "--keep" ]] && keep=1

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

step "Starting the control plane"
KUBECONFIG="$(bash tests/control-plane/cluster.sh start "$work/cluster")"
export KUBECONFIG
kubectl get --raw /readyz >/dev/null && echo "kube-apiserver ready ($KUBECONFIG)"

step "Registering two nodes: the RunPod virtual node and a local node with one GPU"
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
node() { # name, labels JSON, taints JSON, gpus
  cat <<JSON | kubectl create -f - >/dev/null
{"apiVersion": "v1", "kind": "Node",
 "metadata": {"name": "$1", "labels": $2},
 "spec": {"taints": $3},
 "status": {
   "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "$4"},
   "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "$4"},
   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "demo",
                   "lastHeartbeatTime": "$(now)", "lastTransitionTime": "$(now)"}]}}
JSON
}
node virtual-runpod \
  '{"type": "virtual-kubelet", "kubernetes.io/role": "agent", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "virtual-runpod", "virtual-kubelet.io/provider": "runpod"}' \
  '[{"key": "virtual-kubelet.io/provider", "value": "runpod", "effect": "NoSchedule"}, {"key": "virtual-kubelet.io/provider", "value": "runpod", "effect": "PreferNoSchedule"}]' 16
node local-gpu '{"kubernetes.io/hostname": "local-gpu", "kubernetes.io/os": "linux"}' '[]' 1
# Keep both Leases fresh, as kubelets would, so the node lifecycle controller keeps them Ready.
(
  while true; do
    for n in virtual-runpod local-gpu; do
      micro="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
      kubectl apply -f - >/dev/null 2>&1 <<JSON || true
{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
 "metadata": {"name": "$n", "namespace": "kube-node-lease"},
 "spec": {"holderIdentity": "$n", "leaseDurationSeconds": 40, "renewTime": "$micro"}}
JSON
    done
    sleep 10
  done
) &
pids+=($!)
kubectl get nodes -L type

step "Starting the webhook (TLS, certificates from 'runpod-kubelet certs')"
run "$bin" certs --out-dir "$work/certs" --log-level warn
port=$((20000 + RANDOM % 10000))
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
"$bin" webhook --listen "127.0.0.1:$port" \
  --tls-cert "$work/certs/tls.crt" --tls-key "$work/certs/tls.key" \
  --datacenter-ids EU-RO-1,US-TX-3 --max-gpu-price 0.5 >"$work/webhook.log" 2>&1 &
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

step "Submitting a plain GPU Job: 2 pods, 1 GPU each, nothing about RunPod in it"
cat <<'YAML' | tee "$work/job.yaml"
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: demo}
spec:
  parallelism: 2
  completions: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime
        command: ["python", "train.py"]
        ports: [{containerPort: 8888}, {containerPort: 22}]
        resources: {limits: {nvidia.com/gpu: 1}}
YAML
kubectl apply -f "$work/job.yaml"
for _ in $(seq 1 120); do
  bound="$(kubectl -n demo get pods -l job-name=train -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true)"
  [[ "$bound" == 2 ]] && break
  sleep 0.5
done

step "Where the scheduler put them (one fits the local GPU, the other bursts to RunPod)"
run kubectl -n demo get pods -l job-name=train -o wide

step "What the webhook added to the pods"
kubectl -n demo get pods -l job-name=train -o go-template='{{range .items}}pod {{.metadata.name}} on {{.spec.nodeName}}
  annotations: {{range $k, $v := .metadata.annotations}}{{$k}}={{$v}} {{end}}
  tolerations: {{range .spec.tolerations}}{{if .key}}{{.key}}={{.value}}:{{.effect}} {{end}}{{end}}
  preferred node affinity: {{range .spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution}}weight {{.weight}}: {{range .preference.matchExpressions}}{{.key}} {{.operator}} {{.values}}{{end}}{{end}}
{{end}}'

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

step "The RunPod side: the placement candidates for the burst pod (simulated RunPod catalogue)"
# RunPod cannot be reached from here, so the project's RunPod simulator stands in for it.
export RUNPOD_API_KEY="demo-key-$RANDOM$RANDOM"
"$bin" simulator --listen 127.0.0.1:0 >"$work/simulator.out" 2>"$work/simulator.log" &
pids+=($!)
for _ in $(seq 1 50); do grep -q listening "$work/simulator.out" 2>/dev/null && break; sleep 0.2; done
sim_url="$(sed -n 's/^runpod simulator listening on //p' "$work/simulator.out")"
[[ -n "$sim_url" ]] || { echo "the simulator did not start:"; cat "$work/simulator.log"; exit 1; }
echo "simulator: $sim_url"
run "$bin" gpus --runpod-api-url "$sim_url" --gpu-count 1 --datacenter-ids EU-RO-1,US-TX-3 --max-gpu-price 0.5

step "Webhook metrics"
curl -s --cacert "$work/certs/ca.crt" "https://127.0.0.1:$port/metrics" | grep '^runpod_kubelet_admissions_total'

if ((keep)); then
  step "Still running (KUBECONFIG=$KUBECONFIG); Ctrl-C to stop"
  wait
fi
