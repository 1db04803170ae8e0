#!/usr/bin/env python3
"""The webhook against nginx under Debian's `wrk`: an independent check of `cargo bench --bench
webhook_mutate` that any user can repeat.

Starts a real control plane (tests/control-plane/cluster.sh) with the opted-in namespace and Job
of benches/fixtures, the release `runpod-kubelet webhook`, and nginx answering the webhook's own
answer to the review as a fixed body. Both listen over TLS on the same certificate (made by
`runpod-kubelet certs`). Then `wrk` POSTs benches/fixtures/review.json to each, keep-alive, for
every connection count, and the script prints requests/s, latency percentiles, server CPU per
request, the webhook's peak RSS and the ratio to nginx. It fails only when something does not
work (a server that does not start, a wrong answer, failed requests), never on the figures.

`--profile` adds one more 64-connection run of the webhook under `perf record` and prints the
functions where its CPU time goes (see benches/README.md).

Environment and flags: see `--help`. The binary is built with `cargo build --release` unless
`--bin` names one. wrk, nginx and perf are installed with apt-get when missing and run as root.
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "benches" / "fixtures"
CLUSTER = ROOT / "tests" / "control-plane" / "cluster.sh"
NAMESPACE, JOB = "bench", "trainer"

# Targets (figures, not assertions): issue 47's ratio and p99 against nginx's, issue 10's RSS.
TARGET_RATIO_AT_64 = 0.6
TARGET_P99_RATIO_AT_1 = 1.0
TARGET_RSS_MIB = 30.0

POST_LUA = """
local file = assert(io.open(os.getenv("WRK_REVIEW"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"
"""


def log(message):
    print(f"[wrk_compare] {message}", file=sys.stderr, flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.environ.get("RUNPOD_KUBELET_BIN"),
                        help="runpod-kubelet binary (default: cargo build --release)")
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("WRK_SECONDS", 10)),
                        help="measured seconds per run (default 10)")
    parser.add_argument("--warmup", type=float,
                        default=float(os.environ.get("WRK_WARMUP_SECONDS", 2)),
                        help="unmeasured warm-up seconds before each run (default 2)")
    parser.add_argument("--connections", default=os.environ.get("WRK_CONNECTIONS", "1,64"),
                        help="connection counts, comma-separated (default 1,64)")
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("WRK_ROUNDS", 1)),
                        help="runs of each server per connection count, alternated; the ratios "
                             "are the medians of the rounds' (default 1)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("WRK_THREADS", 1)),
                        help="wrk threads (default 1: on 2 cores the other core is the server's)")
    parser.add_argument("--nginx-workers", default=os.environ.get("WRK_NGINX_WORKERS", "auto"),
                        help="nginx worker_processes (default auto: one per core, like the "
                             "webhook's runtime)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the webhook at 64 connections with perf")
    parser.add_argument("--keep-control-plane-running", action="store_true",
                        help="do not pause the control plane while wrk runs (by default its "
                             "processes are stopped with SIGSTOP during each run, so that they "
                             "do not take the cores from either server; the webhook answers "
                             "from its watch caches)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def ensure_tools(profile):
    wanted = {"wrk": "wrk", "nginx": "nginx-light", "curl": "curl"}
    if profile:
        wanted["perf"] = "linux-perf"
    missing = [package for tool, package in wanted.items() if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(f"wrk_compare: missing {' '.join(missing)}; install them: "
                 f"sudo apt-get install {' '.join(missing)}")
    log(f"installing {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def binary(args):
    if args.bin:
        return Path(args.bin)
    log("building the release binary (cargo build --release)")
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "runpod-kubelet"],
                   cwd=ROOT, check=True)
    return ROOT / "target" / "release" / "runpod-kubelet"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kubectl(kubeconfig, *args, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], input=stdin,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def https(url, ca, body=None):
    """(status, body) of one request; certificate checked against the bench CA."""
    import ssl
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def wait_ready(url, ca, process, name, log_path):
    deadline = time.monotonic() + 60
    last = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}): {tail(log_path)}")
        try:
            status, _ = https(url, ca)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as error:
            last = str(error)
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready within 60 s ({last}): {tail(log_path)}")


def tail(path, lines=20):
    try:
        return "\n" + "\n".join(Path(path).read_text().splitlines()[-lines:])
    except OSError:
        return ""


def nginx_string(text):
    """A single-quoted nginx string; `$` would be read as a variable, so it may not appear."""
    if "$" in text:
        raise RuntimeError("the fixed body contains '$', which nginx's return cannot carry")
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def nginx_conf(work, port, certs, body, workers):
    temp = {name: work / "nginx" / name for name in
            ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    return f"""
worker_processes {workers};
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {temp['client_body']};
    proxy_temp_path {temp['proxy']};
    fastcgi_temp_path {temp['fastcgi']};
    uwsgi_temp_path {temp['uwsgi']};
    scgi_temp_path {temp['scgi']};
    keepalive_requests 1000000000;
    keepalive_timeout 75s;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {certs}/tls.crt;
        ssl_certificate_key {certs}/tls.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {{
            default_type application/json;
            return 200 {nginx_string(body)};
        }}
    }}
}}
"""


def process_tree(pid):
    """`pid` and its children (nginx's master and workers)."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(entry.name))
    return pids


def cpu_seconds(pids):
    """CPU time of every thread of `pids`, from the scheduler's statistics (ns resolution)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total / 1e9


def peak_rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(output):
    """Requests/s, latency percentiles (ms), total requests and failures from `wrk --latency`."""
    figures = {"percentiles": {}, "failures": 0}
    match = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if not match:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{output}")
    figures["rps"] = float(match.group(1))
    match = re.search(r"(\d+) requests in", output)
    figures["requests"] = int(match.group(1)) if match else 0
    for percent, value, unit in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", output, re.M):
        figures["percentiles"][int(percent)] = float(value) * UNIT[unit]
    match = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    if match:
        figures["failures"] += int(match.group(1))
    match = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    if match:
        figures["failures"] += sum(int(n) for n in match.groups())
    return figures


class Servers:
    """The control plane, the webhook and nginx; stopped by `close` (also on error)."""

    def __init__(self, work):
        self.work = work
        self.processes = []
        self.cluster_dir = None

    def start_cluster(self):
        log("starting the control plane (about 10 s)")
        subprocess.run(["bash", str(CLUSTER), "install"], check=True, stdout=subprocess.DEVNULL)
        self.cluster_dir = self.work / "cluster"
        result = subprocess.run(["bash", str(CLUSTER), "start", str(self.cluster_dir)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"cluster.sh start failed:\n{result.stderr}")
        return Path(result.stdout.strip().splitlines()[-1])

    def control_plane_pids(self):
        """The control plane's processes (cluster.sh's pid files), alive ones whose command line
        names the cluster's directory (as cluster.sh's `live_pid` checks: a reused pid is left
        alone)."""
        if self.cluster_dir is None:
            return []
        pids = []
        for pid_file in sorted((self.cluster_dir / "pids").glob("*.pid")):
            try:
                pid = int(pid_file.read_text().strip())
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except (OSError, ValueError):
                continue
            if f"{self.cluster_dir}/".encode() in command:
                pids.append(pid)
        return pids

    def spawn(self, name, command, env=None):
        log_path = self.work / f"{name}.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                       stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        self.processes.append(process)
        return process, log_path

    def close(self):
        # A stopped process would hold cluster.sh's SIGTERM until killed.
        continue_all(self.control_plane_pids())
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        if self.cluster_dir is not None:
            subprocess.run(["bash", str(CLUSTER), "stop", str(self.cluster_dir)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def whole_seconds(seconds):
    """wrk takes whole seconds."""
    return max(1, round(seconds))


def run_wrk(url, connections, seconds, threads, review, lua):
    threads = max(1, min(threads, connections))
    command = ["wrk", "--latency", "-t", str(threads), "-c", str(connections),
               "-d", f"{whole_seconds(seconds)}s", "-s", str(lua), url]
    result = subprocess.run(command, capture_output=True, text=True,
                            env=dict(os.environ, WRK_REVIEW=str(review)))
    if result.returncode != 0:
        raise RuntimeError(f"wrk failed: {result.stderr}{result.stdout}")
    return parse_wrk(result.stdout)


def continue_all(pids):
    """SIGCONT to each of `pids` (one that has exited since is skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


class Paused:
    """The control plane stopped (SIGSTOP) for the duration of a `with` block, continued after
    (also on error; `Servers.close` continues it too). `servers` is None to leave it running."""

    def __init__(self, servers):
        self.servers = servers
        self.pids = []

    def __enter__(self):
        if self.servers is None:
            return
        self.pids = self.servers.control_plane_pids()
        if not self.pids:
            raise RuntimeError("no control-plane process to pause (cluster.sh's pid files); "
                               "pass --keep-control-plane-running to measure without pausing")
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def __exit__(self, *exc):
        continue_all(self.pids)


def measure(name, url, pids, connections, args, review, lua, paused):
    if args.warmup > 0:
        run_wrk(url, connections, args.warmup, args.threads, review, lua)
    before = cpu_seconds(pids)
    with Paused(paused):
        figures = run_wrk(url, connections, args.seconds, args.threads, review, lua)
    used = cpu_seconds(pids) - before
    figures["cpu_us"] = 1e6 * used / figures["requests"] if figures["requests"] else float("nan")
    figures["cores"] = used / whole_seconds(args.seconds)
    if figures["failures"]:
        raise RuntimeError(f"{name} at {connections} connections: "
                           f"{figures['failures']} failed requests")
    return figures


def ratios(results, count, figure):
    """The webhook's figure over nginx's, round by round (NaN where nginx's is zero)."""
    pairs = zip(results[("webhook", count)], results[("nginx", count)])
    return [figure(w) / figure(n) if figure(n) > 0 else float("nan") for w, n in pairs]


def median(values):
    """The median of the values that are numbers (NaN when none is)."""
    ordered = sorted(value for value in values if not math.isnan(value))
    if not ordered:
        return float("nan")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def profile(url, pid, work, args, review, lua):
    data = work / "perf.data"
    log("profiling the webhook at 64 connections with perf")
    recorder = subprocess.Popen(["perf", "record", "-F", "1999", "-g", "-p", str(pid),
                                 "-o", str(data), "--", "sleep", str(args.seconds)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_wrk(url, 64, args.seconds, args.threads, review, lua)
    recorder.wait()
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--stdio",
                             "--sort", "symbol", "--percent-limit", "1", "-g", "none"],
                            capture_output=True, text=True)
    lines = [line for line in report.stdout.splitlines() if line and not line.startswith("#")]
    print("\nwebhook profile at 64 connections (self time, symbols over 1%):")
    for line in lines[:40]:
        print(f"  {line.strip()}")
    print(f"(perf data: {data}; `perf report -i {data}` for call graphs)")


def main():
    args = parse_args()
    # So that a cancelled run (SIGTERM, SIGHUP) still stops the servers and continues the
    # control plane in `finally`.
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda *_: sys.exit("wrk_compare: stopped by a signal"))
    connections = [int(n) for n in args.connections.split(",") if n.strip()]
    ensure_tools(args.profile)
    if shutil.which("kubectl") is None:
        log("building kubectl (once; cached)")
        built = subprocess.run(["bash", str(CLUSTER), "kubectl"], check=True, capture_output=True,
                               text=True).stdout.strip().splitlines()[-1]
        os.environ["PATH"] = f"{Path(built).parent}{os.pathsep}{os.environ['PATH']}"
    program = binary(args)
    work = Path(tempfile.mkdtemp(prefix="wrk-compare-"))
    servers = Servers(work)
    try:
        kubeconfig = servers.start_cluster()
        kubectl(kubeconfig, "apply", "-f", "-",
                stdin=(FIXTURES / "namespace-and-job.json").read_text())
        job_uid = kubectl(kubeconfig, "get", "job", JOB, "-n", NAMESPACE, "-o",
                          "jsonpath={.metadata.uid}").strip()
        review_json = json.loads((FIXTURES / "review.json").read_text().replace("JOB_UID", job_uid))
        review = work / "review.json"
        review.write_text(json.dumps(review_json, separators=(",", ":")))
        lua = work / "post.lua"
        lua.write_text(POST_LUA)

        certs = work / "certs"
        subprocess.run([str(program), "certs", "--out-dir", str(certs), "--log-level", "warn"],
                       check=True, stdout=subprocess.DEVNULL)
        ca = certs / "ca.crt"

        webhook_port = free_port()
        webhook, webhook_log = servers.spawn("webhook", [
            str(program), "webhook", "--listen", f"127.0.0.1:{webhook_port}",
            "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
            "--datacenter-ids", "EU-RO-1,US-TX-3", "--max-gpu-price", "0.5",
            "--log-level", "warn"], env=dict(os.environ, KUBECONFIG=str(kubeconfig)))
        webhook_url = f"https://127.0.0.1:{webhook_port}"
        wait_ready(f"{webhook_url}/readyz", ca, webhook, "the webhook", webhook_log)
        status, answer = https(f"{webhook_url}/mutate", ca, review.read_bytes())
        response = json.loads(answer).get("response", {}) if status == 200 else {}
        if not (response.get("allowed") is True and response.get("patchType") == "JSONPatch"):
            raise RuntimeError(f"the webhook did not admit the review with a patch: "
                               f"HTTP {status} {answer[:500]!r}")

        nginx_port = free_port()
        conf = work / "nginx.conf"
        conf.write_text(nginx_conf(work, nginx_port, certs, answer.decode(), args.nginx_workers))
        nginx, nginx_log = servers.spawn("nginx", ["nginx", "-p", str(work), "-c", str(conf),
                                                   "-e", str(work / "nginx-error.log")])
        nginx_url = f"https://127.0.0.1:{nginx_port}"
        wait_ready(f"{nginx_url}/readyz", ca, nginx, "nginx", nginx_log)
        status, fixed = https(f"{nginx_url}/mutate", ca, review.read_bytes())
        if status != 200 or fixed != answer:
            raise RuntimeError(f"nginx does not answer the webhook's body: HTTP {status}")

        cpus = os.cpu_count()
        print(f"\nwrk_compare: POST /mutate over TLS, keep-alive; wrk {args.threads} thread(s); "
              f"{args.warmup:g} s warm-up + {args.seconds:g} s per run; {cpus} CPU(s); nginx "
              f"worker_processes {args.nginx_workers}; control plane "
              + ("running" if args.keep_control_plane_running else
                 f"paused ({len(servers.control_plane_pids())} processes)")
              + " during each run")
        print(f"review {review.stat().st_size} bytes; both answer the webhook's {len(answer)}-byte "
              "answer (nginx as a fixed body)\n")
        label_width = max(8, len(f"webhook {args.rounds}"))
        header = (f"{'server':<{label_width}} {'conns':>5} {'req/s':>9} {'p50 ms':>8} {'p90 ms':>8} "
                  f"{'p99 ms':>8} {'CPU/req':>9} {'cores':>6}")
        print(header)
        results = {}
        paused = None if args.keep_control_plane_running else servers
        for count in connections:
            # Rounds alternate the two servers, so that each pair of runs shares the machine's
            # state of the moment; the comparison is the median of the rounds' ratios.
            for round_number in range(1, args.rounds + 1):
                for name, url, pids in (("webhook", webhook_url, [webhook.pid]),
                                        ("nginx", nginx_url, process_tree(nginx.pid))):
                    figures = measure(name, f"{url}/mutate", pids, count, args, review, lua,
                                      paused)
                    results.setdefault((name, count), []).append(figures)
                    p = figures["percentiles"]
                    label = name if args.rounds == 1 else f"{name} {round_number}"
                    print(f"{label:<{label_width}} {count:>5} {figures['rps']:>9.0f} {p.get(50, 0):>8.3f} "
                          f"{p.get(90, 0):>8.3f} {p.get(99, 0):>8.3f} "
                          f"{figures['cpu_us']:>6.1f} µs {figures['cores']:>6.2f}", flush=True)
        rss = peak_rss_mib(webhook.pid)
        if webhook.poll() is not None:
            raise RuntimeError(f"the webhook exited during the runs: {tail(webhook_log)}")
        # Every review was answered as the first one was (none refused for a failed lookup).
        status, metrics = https(f"{webhook_url}/metrics", ca)
        counted = {outcome: float(value) for outcome, value in re.findall(
            r'^runpod_kubelet_admissions_total\{outcome="(\w+)"\} (\S+)$',
            metrics.decode(), re.M)}
        others = {outcome: n for outcome, n in counted.items() if outcome != "mutated" and n}
        if status != 200 or not counted.get("mutated") or others:
            raise RuntimeError(f"the webhook did not admit every review with a patch: {counted}")

        throughput = {count: ratios(results, count, lambda f: f["rps"]) for count in connections}
        p99_ratios = {count: ratios(results, count,
                                    lambda f: f["percentiles"].get(99, float("nan")))
                      for count in connections}
        print("\nwebhook / nginx" + ("" if args.rounds == 1 else
                                     f" (median of {args.rounds} alternated rounds)") + ":")
        for count in connections:
            if args.rounds == 1:
                w, n = results[("webhook", count)][0], results[("nginx", count)][0]
                print(f"  {count:>3} conn: {w['rps']:.0f} / {n['rps']:.0f} req/s = "
                      f"{100 * median(throughput[count]):.0f}%; p99 "
                      f"{w['percentiles'].get(99, float('nan')):.3f} / "
                      f"{n['percentiles'].get(99, float('nan')):.3f} ms = "
                      f"{median(p99_ratios[count]):.2f} x")
            else:
                each = ", ".join(f"{100 * r:.0f}%" for r in throughput[count])
                print(f"  {count:>3} conn: req/s {100 * median(throughput[count]):.0f}% ({each}); "
                      f"p99 {median(p99_ratios[count]):.2f} x")
        met = lambda ok: "met" if ok else "NOT met"
        print("targets:")
        if 64 in throughput:
            ratio = median(throughput[64])
            print(f"  throughput @ 64 conns: {100 * ratio:.0f}% of nginx "
                  f"(target >= {100 * TARGET_RATIO_AT_64:.0f}%): {met(ratio >= TARGET_RATIO_AT_64)}")
        if 1 in p99_ratios:
            times = median(p99_ratios[1])
            each = ", ".join(f"{r:.2f}" for r in p99_ratios[1])
            print(f"  p99 @ 1 conn: {times:.2f} x nginx's"
                  + ("" if args.rounds == 1 else f" ({each})")
                  + f" (target <= {TARGET_P99_RATIO_AT_1:.1f} x): "
                  f"{met(times <= TARGET_P99_RATIO_AT_1)}")
        print(f"  webhook peak RSS: {rss:.1f} MiB (target < {TARGET_RSS_MIB:.0f} MiB): "
              f"{met(rss < TARGET_RSS_MIB)}")
        if args.profile:
            profile(f"{webhook_url}/mutate", webhook.pid, work, args, review, lua)
    finally:
        servers.close()
        if not args.profile:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, subprocess.CalledProcessError) as error:
        sys.exit(f"wrk_compare: error: {error}")
