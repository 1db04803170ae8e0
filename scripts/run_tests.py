#!/usr/bin/env python3
"""Runs every test binary of the workspace, several at a time.

`cargo test` runs its test binaries one after the other; the end-to-end suites spend most of
their time waiting on a control plane, so running them side by side cuts the wall time without
changing what is tested. Builds once (`cargo test --no-run`), then runs each binary from its
package directory as cargo would, longest first, `--jobs` at a time (default 3). Prints each
binary's output when it ends, a timing table, and exits non-zero if any binary failed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

# Slowest first, so the pool ends together (names of test targets; the rest follow).
SLOW_FIRST = [
    "e2e_controller_crash",
    "e2e_chaos",
    "e2e_controller_outage",
    "e2e_controller_node",
    "e2e_controller_review",
    "e2e_offload",
    "e2e_helm",
    "e2e_quickstart",
    "image",
    "e2e",
    "e2e_controller_faults",
    "e2e_controller_ha",
    "e2e_controller",
    "e2e_kubelet_authz",
    "e2e_metrics",
    "e2e_vastai",
    "e2e_examples",
    "e2e_cheapest",
    "e2e_budgets",
    "e2e_exec",
    "e2e_network",
    "e2e_interruptible",
    "e2e_volumes",
    "e2e_certs",
    "runpod_quota",
    "chart",
]


def build(extra):
    """Builds every test target; returns [(name, kind, package_dir, executable)]."""
    cmd = ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    cmd += extra
    done = subprocess.run(cmd, stdout=subprocess.PIPE, check=False, text=True)
    if done.returncode != 0:
        # A linker killed by SIGBUS is most often a full disk: say how full it is.
        meta = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"],
                              stdout=subprocess.PIPE, check=False, text=True)
        try:
            target = json.loads(meta.stdout)["target_directory"]
        except (json.JSONDecodeError, KeyError):
            target = os.environ.get("CARGO_TARGET_DIR", "target")
        subprocess.run(["df", "-h", target], check=False)
        subprocess.run(["du", "-sh", target], check=False)
        sys.exit(f"building the test binaries failed (exit {done.returncode})")
    out = done.stdout
    binaries = []
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = target["kind"][0]
        name = target["name"] if kind != "lib" else f"{target['name']} (lib)"
        if kind == "bin":
            name = f"{target['name']} (bin)"
        binaries.append((name, kind, os.path.dirname(msg["manifest_path"]), msg["executable"]))
    return binaries


def run(binary, filters):
    name, _kind, cwd, executable = binary
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as log:
        status = subprocess.run([executable, *filters], cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, check=False).returncode
        log.seek(0)
        output = log.read()
    return name, status, time.monotonic() - start, output


def order(binary):
    name = binary[0]
    return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", "3")))
    parser.add_argument("filters", nargs="*", help="passed to every test binary")
    args = parser.parse_args()

    binaries = sorted(build([]), key=order)
    print(f"== running {len(binaries)} test binaries, {args.jobs} at a time", flush=True)
    failed = []
    timings = []
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run, b, args.filters) for b in binaries]
        for future in as_completed(futures):
            name, status, seconds, output = future.result()
            timings.append((seconds, name, status))
            verdict = "ok" if status == 0 else f"FAILED (exit {status})"
            print(f"\n---- {name}: {verdict} in {seconds:.0f}s", flush=True)
            # Passing suites: the summary lines only; failing ones: everything.
            lines = output.splitlines()
            if status == 0:
                lines = [l for l in lines if l.startswith("test result") or " ... " in l][-15:]
            print("\n".join(lines), flush=True)
            if status != 0:
                failed.append((name, output))
    print(f"\n== {len(binaries)} test binaries in {time.monotonic() - started:.0f}s")
    for seconds, name, status in sorted(timings, reverse=True)[:12]:
        print(f"  {seconds:6.0f}s  {name}{'' if status == 0 else '  FAILED'}")
    if failed:
        # CI shows only the end of the log: repeat what each failure said last.
        for name, output in failed:
            lines = output.splitlines()
            said = [l for l in lines
                    if any(k in l for k in ("panicked", "assert", "Error", "FAILED", "seed", "| "))]
            # The tail first, then what the test said: CI's view keeps the end.
            print(f"\n==== {name}: its last lines")
            print("\n".join(lines[-60:]))
            print(f"\n==== {name}: what it said")
            print("\n".join(said[-30:]))
        print(f"FAILED: {', '.join(n for n, _ in failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
