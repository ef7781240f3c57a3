#!/usr/bin/env python3
"""User-space instructions per request of the gateway, the bare hyper proxy and the reading
proxy, counted by callgrind (issue 31).

The CPU ratios of `gateway_nginx --cpu` move by 10-15% from round to round on this machine;
callgrind counts the instructions a front executes, which are the same for the same binary
and the same requests whatever else the machine does. Each front (the three of
`gateway_nginx --cpu`: `gateway_nginx --bare-proxy`, the same with `--read-tokens`, and
`tailguard-gateway` with every default) runs under `valgrind --tool=callgrind` over two
`tailguard-mock` replicas (`gateway_nginx`'s script: first token 20 ms, 50 tokens 10 ms
apart); a warm-up load (2 s at 20 streams/s), then the counters are zeroed, the measured
load runs (10 s at 20 streams/s, a fixed seed), and the counters are dumped. The figure is
the dump's instructions over the requests the load completed.

What it does not count: the kernel's work (system calls, wake-ups), which is most of a
front's CPU at these rates; `gateway_nginx --cpu` measures that, noisily. Under callgrind a
front runs ~50x slower, on one thread at a time, so timing figures of the load mean nothing.

    python3 benches/instructions/instructions.py [--out FILE] [--target-dir DIR] [--no-build]

Writes `benches/results/instructions.json` and prints a table. Needs valgrind (on every
machine of this project's kind; Debian's `valgrind` package elsewhere). Builds the three
binaries with `cargo build --release` first unless `--no-build`. Not part of CI: about 3
minutes.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = "ttft=20ms,tokens=50,gap=10ms"
RATE = 20
WARMUP = "2s"
MEASURED = "10s"
SEED = 3


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def wait_for(path, pattern, count, timeout=120):
    """The first `count` matches of `pattern` in the file at `path`, waiting for them."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            found = re.findall(pattern, open(path).read())
        except FileNotFoundError:
            found = []
        if len(found) >= count:
            return found[:count]
        time.sleep(0.2)
    raise RuntimeError(f"{path}: no {pattern!r} after {timeout}s")


def front(name, cmd, bins, work):
    """Runs one front (`cmd(urls)`: its command line over the replicas' URLs) under callgrind
    over fresh replicas; returns its figures."""
    mock_log = os.path.join(work, f"{name}-mock.log")
    front_log = os.path.join(work, f"{name}-front.log")
    out = os.path.join(work, f"{name}.callgrind")
    mock = subprocess.Popen(
        [bins["mock"], "serve", "--replicas", "2", "--port", "0", "--script", SCRIPT,
         "--for", "600s"],
        stdout=open(mock_log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    fr = None
    try:
        urls = wait_for(mock_log, r"http://127\.0\.0\.1:\d+", 2)
        fr = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + cmd(urls),
            stdout=open(front_log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        url = wait_for(front_log, r"listening on (http://127\.0\.0\.1:\d+)", 1)[0]
        load = [bins["mock"], "load", "--url", url, "--rate", str(RATE)]
        run(load + ["--duration", WARMUP, "--seed", str(SEED + 1)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run(["callgrind_control", "-z", str(fr.pid)], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        summary = os.path.join(work, f"{name}-load.json")
        run(load + ["--duration", MEASURED, "--seed", str(SEED), "--json", summary],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run(["callgrind_control", "-d", str(fr.pid)], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        dump = wait_for_dump(out)
        completed = completed_requests(json.load(open(summary)))
        return {"instructions": dump, "completed": completed,
                "per_request": dump / completed if completed else None}
    finally:
        for p in (fr, mock):
            if p and p.poll() is None:
                os.killpg(p.pid, signal.SIGINT if p is fr else signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def wait_for_dump(out):
    """The instruction total of the first dump (`<out>.1`) once it is written."""
    path = out + ".1"
    totals = wait_for(path, r"\ntotals: (\d+)", 1)
    return int(totals[0])


def completed_requests(summary):
    """Requests whose stream completed, from `tailguard-mock load --json`."""
    return int(summary["end_reasons"].get("completed", 0))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benches/results/instructions.json"))
    p.add_argument("--target-dir", default=os.environ.get("CARGO_TARGET_DIR",
                                                           os.path.join(ROOT, "target")))
    p.add_argument("--no-build", action="store_true")
    a = p.parse_args(argv)
    for tool in ("valgrind", "callgrind_control"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: install Debian's valgrind package")
    if not a.no_build:
        env = dict(os.environ, CARGO_TARGET_DIR=a.target_dir)
        for pkg, extra in (("tailguard-gateway", []), ("tailguard-mock", []),
                           ("tailguard-benches", ["--bin", "gateway_nginx"])):
            run(["cargo", "build", "-q", "--release", "-p", pkg] + extra, cwd=ROOT, env=env)
    rel = os.path.join(a.target_dir, "release")
    bins = {"mock": os.path.join(rel, "tailguard-mock"),
            "bench": os.path.join(rel, "gateway_nginx"),
            "gateway": os.path.join(rel, "tailguard-gateway")}
    fronts = [
        ("bare proxy", lambda urls: [bins["bench"], "--bare-proxy", *urls]),
        ("reading proxy", lambda urls: [bins["bench"], "--bare-proxy", "--read-tokens", *urls]),
        ("gateway", lambda urls: [bins["gateway"], "--listen", "127.0.0.1:0"]
         + [a for u in urls for a in ("--upstream", u)]),
    ]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip() != ""
    result = {
        "bench": "instructions",
        "run": {"started_unix_s": int(time.time()),
                "load_average_start": list(os.getloadavg()),
                "commit": commit + ("-dirty" if dirty else "")},
        "config": {"script": SCRIPT, "rate": RATE, "warmup": WARMUP, "measured": MEASURED,
                   "seed": SEED},
        "fronts": {},
    }
    with tempfile.TemporaryDirectory(prefix="tailguard-instructions-") as work:
        for name, cmd in fronts:
            result["fronts"][name] = front(name, cmd, bins, work)
            f = result["fronts"][name]
            print(f"{name:14} {f['per_request'] / 1000:8.1f}k instructions a request "
                  f"({f['completed']} requests)", flush=True)
    per = {k: v["per_request"] for k, v in result["fronts"].items()}
    result["ratios"] = {
        "gateway / bare proxy": per["gateway"] / per["bare proxy"],
        "reading proxy / bare proxy": per["reading proxy"] / per["bare proxy"],
        "gateway / reading proxy": per["gateway"] / per["reading proxy"],
    }
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.3f}x")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
