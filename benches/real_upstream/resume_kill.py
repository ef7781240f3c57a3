#!/usr/bin/env python3
"""Resume experiment (issue 33): a real llama.cpp replica killed mid-stream behind the gateway.

Two single-slot llama-cpp-python replicas (SmolLM2-135M-Instruct Q4, one thread each, queue
mode) behind `tailguard-gateway --resume on`. For each prompt: the uninterrupted greedy answer
straight from each replica (`/v1/completions`, temperature 0, repeat_penalty 1, fixed seed,
streamed); then the same request through the gateway, and after K content chunks (K drawn,
seeded, from the middle third of the answer) the replica generating it (the one whose CPU time
advances) is SIGKILLed. The client reads its stream to the end; the trial records whether it
completed (a finish reason and `[DONE]`, no error event), whether its text is identical to the
uninterrupted one (where not: the first differing character, both texts, and why: the
continuation replayed cold and on the prefix's own KV cache, and the prefix re-tokenised), the
resumes the gateway counted, the longest pause and the total time. The killed replica is
restarted (same port) before the next prompt. Writes JSON and prints a markdown summary. Not
part of CI; see README.md beside this file.

    python3 benches/real_upstream/resume_kill.py --quick

Like real_upstream.py, it installs (or reuses) the cached virtualenv of scripts/real-servers.sh
and re-runs itself with that venv's python.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import procs  # noqa: E402  (stdlib only)
import real_upstream as ru  # noqa: E402  (gateway_binary, versions, scrape; no side effects)

# Varied short prompts: (kind, subject) → "Write a short story about X." / "Explain Y.".
STORIES = ["a lighthouse keeper", "a lost robot", "a dragon who cannot fly", "a clockmaker",
           "a girl who finds a map", "a talking cat", "the last tree on Mars",
           "a sailor and a storm", "a baker in Paris", "a forgotten violin"]
EXPLAINS = ["how rainbows form", "why the sky is blue", "how a compass works",
            "what photosynthesis is", "how vaccines work", "why ice floats",
            "how a bicycle stays upright", "what a black hole is", "how bread rises",
            "why leaves change colour in autumn"]

RESUME_FAMILIES = ("tailguard_resumes_total", "tailguard_hedge_sent_total",
                   "tailguard_hedge_all_failed_total", "tailguard_hedge_ejections_total")


# The model is SmolLM2-135M-*Instruct*: given a bare instruction as a completions prompt it
# mostly ends at once (an empty answer), so each prompt is one user turn in its ChatML template,
# rendered as text (what a client of /v1/completions does with an instruct model).
TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def instructions(n: int) -> list[str]:
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(f"Write a short story about {STORIES[(i // 2) % len(STORIES)]}.")
        else:
            out.append(f"Explain {EXPLAINS[(i // 2) % len(EXPLAINS)]}.")
        if i >= len(STORIES) + len(EXPLAINS):
            out[-1] += f" (Take {i // (len(STORIES) + len(EXPLAINS)) + 1}.)"
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 3 trials, results to a git-ignored file")
    p.add_argument("--trials", type=int, default=20, help="prompts, one kill each")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request")
    p.add_argument("--seed", type=int, default=33,
                   help="the requests' `seed` and the draw of K (the chunk after which to kill)")
    p.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="the requests' repeat_penalty: 1.0 (none) makes temperature 0 plain "
                        "greedy decoding; llama-cpp-python's server defaults to 1.1, which penalises "
                        "the tokens *it* generated, so a continuation (whose prefix is prompt to "
                        "it) is penalised differently from the uninterrupted stream")
    p.add_argument("--settle", type=float, default=6.0,
                   help="seconds between a restarted replica's warm-up and the next trial")
    p.add_argument("--gateway-flags", default="",
                   help='extra tailguard-gateway flags, e.g. "--outlier-ejection off" '
                        "(--resume on is always set)")
    p.add_argument("--no-diagnose", action="store_true",
                   help="skip the replay and re-tokenisation checks of a differing answer")
    p.add_argument("--batch-threads", type=int, default=1,
                   help="each replica's --n_threads_batch (0: the server's default)")
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--out", type=Path, default=None,
                   help="JSON output [default: benches/results/real_resume.json; --quick: "
                        "benches/results/real_resume_quick.tmp]")
    p.add_argument("--gateway-bin", type=Path, default=None,
                   help="tailguard-gateway binary [default: target/release/tailguard-gateway, "
                        "built with cargo if missing]")
    p.add_argument("--build-timeout", type=float, default=1800.0)
    p.add_argument("--venv", type=Path, default=None, help="skip scripts/real-servers.sh")
    p.add_argument("--model", type=Path, default=None, help="GGUF file (with --venv)")
    p.add_argument("--log-dir", type=Path, default=None,
                   help="child logs [default: a new /tmp directory]")
    a = p.parse_args(argv)
    if a.quick:
        a.trials = 3
    if a.trials < 1 or a.max_tokens < 6:
        p.error("--trials must be at least 1 and --max-tokens at least 6")
    a.extra_flags = shlex.split(a.gateway_flags)
    if a.out is None:
        a.out = ROOT / "benches/results" / ("real_resume_quick.tmp" if a.quick else "real_resume.json")
    return a


def bootstrap(a) -> tuple[Path, Path]:
    """Finds the venv and the model; re-executes this script under the venv's python."""
    venv, gguf = a.venv, a.model
    if venv is None or gguf is None:
        print("resume_kill: checking the real-server venv (scripts/real-servers.sh)", file=sys.stderr)
        r = subprocess.run([str(ROOT / "scripts/real-servers.sh")], stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"resume_kill: scripts/real-servers.sh failed ({r.returncode}); see above")
        kv = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        venv, gguf = Path(kv["VENV"]), Path(kv["GGUF"])
    if Path(sys.prefix).resolve() != venv.resolve():
        py = venv / "bin/python"
        argv = [str(py), str(Path(__file__).resolve()), *sys.argv[1:], "--venv", str(venv), "--model", str(gguf)]
        os.execv(str(py), argv)
    return venv, gguf


# ---------------------------------------------------------------------------------------------
# Replicas: start, kill, restart; which one is generating.


class Replicas:
    def __init__(self, a, venv: Path, gguf: Path, log_dir: Path):
        self.a, self.venv, self.gguf, self.log_dir = a, venv, gguf, log_dir
        self.ports = [procs.free_port(), procs.free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.children: list[procs.Child | None] = [None, None]
        self.starts = [0, 0]

    def argv(self, k: int) -> list[str]:
        argv = [str(self.venv / "bin/python"), "-m", "llama_cpp.server", "--model", str(self.gguf),
                "--host", "127.0.0.1", "--port", str(self.ports[k]), "--n_ctx", "2048",
                "--n_threads", "1", "--model_alias", "default", "--interrupt_requests", "False"]
        if self.a.batch_threads > 0:
            argv += ["--n_threads_batch", str(self.a.batch_threads)]
        return argv

    def start(self, k: int) -> None:
        self.starts[k] += 1
        self.children[k] = procs.Child(f"replica{k + 1}-{self.starts[k]}", self.argv(k), self.log_dir)

    def ready(self, k: int, http) -> None:
        procs.wait_http(self.children[k], self.urls[k] + "/v1/models", timeout=90)
        # Warm it (model pages, first-call setup) with one short request.
        complete_direct(http, self.urls[k], "Hello", 2, self.a.seed)

    def pid(self, k: int) -> int:
        return self.children[k].proc.pid

    def kill(self, k: int) -> None:
        """SIGKILL, no grace: the replica dies mid-token, as on a crash or an OOM kill."""
        child = self.children[k]
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.proc.wait(timeout=10)
        child.stop()


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process (every thread), in clock ticks, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


class CpuSampler:
    """Samples both replicas' CPU time every 50 ms in the background, so the one generating is
    known as soon as the K-th chunk arrives (at ~35 tokens/s, a blocking 150 ms sample would
    let ~5 more tokens through before the kill)."""

    def __init__(self, pids: list[int], every: float = 0.05):
        self.pids, self.every = pids, every
        self.samples: list[tuple[float, list[int | None]]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            s = (time.monotonic(), [cpu_ticks(p) for p in self.pids])
            with self._lock:
                self.samples.append(s)
            self._stop.wait(self.every)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=2)

    def generating(self, window: float = 0.15, tries: int = 6) -> tuple[int, dict]:
        """The replica whose CPU time advanced over the last `window` seconds (and the other's
        did not, or far less); retried a few windows if both or neither moved."""
        info: dict = {"windows": []}
        for _ in range(tries):
            deadline = time.monotonic() + 2 * window
            while time.monotonic() < deadline:
                with self._lock:
                    now = self.samples[-1] if self.samples else None
                    old = next((s for s in reversed(self.samples)
                                if now and s[0] <= now[0] - window), None)
                if old is not None:
                    break
                time.sleep(self.every / 2)
            if old is None:
                continue
            deltas = [(n - o) if n is not None and o is not None else -1
                      for n, o in zip(now[1], old[1])]
            info["windows"].append({"seconds": round(now[0] - old[0], 3), "ticks": deltas})
            best = max(range(len(deltas)), key=lambda i: deltas[i])
            others = [d for i, d in enumerate(deltas) if i != best]
            if deltas[best] >= 2 and all(d * 3 <= deltas[best] for d in others):
                info["clear"] = True
                return best, info
            time.sleep(window)
        info["clear"] = False
        deltas = info["windows"][-1]["ticks"] if info["windows"] else [0, 0]
        return max(range(len(deltas)), key=lambda i: deltas[i]), info


# ---------------------------------------------------------------------------------------------
# Streaming /v1/completions, read event by event.


REPEAT_PENALTY = 1.0  # set from --repeat-penalty


def body(prompt: str, max_tokens: int, seed: int) -> dict:
    return {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "seed": seed, "repeat_penalty": REPEAT_PENALTY, "stream": True}


class Http:
    """Plain `http.client` (the venv's openai SDK no longer ships `httpx`): one connection per
    request, so a killed replica never leaves a stale pooled connection behind."""

    def __init__(self, timeout: float):
        self.timeout = timeout

    def open(self, url: str, path: str, payload: dict, timeout: float | None = None):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout or self.timeout)
        conn.request("POST", path, body=json.dumps(payload).encode(),
                     headers={"content-type": "application/json", "accept": "text/event-stream"})
        return conn, conn.getresponse()

    def post_json(self, url: str, payload: dict) -> dict | None:
        u = urllib.parse.urlsplit(url)
        try:
            conn, r = self.open(f"{u.scheme}://{u.netloc}", u.path, payload, 30)
            try:
                data = r.read()
                return json.loads(data) if r.status == 200 else None
            finally:
                conn.close()
        except (OSError, ValueError, http.client.HTTPException):
            return None


def read_stream(http_, url: str, payload: dict, on_chunk=None, timeout: float = 60.0) -> dict:
    """Streams one completion; records every content chunk with its arrival time.

    `on_chunk(n)` runs after the n-th content chunk (it may block: later chunks wait in the
    socket). Returns text, the chunks, finish reason, whether `[DONE]` came, errors, times."""
    t0 = time.monotonic()
    rec = {"t0": t0, "status": None, "headers": {}, "chunks": [], "times": [], "finish": None,
           "done": False, "error_events": [], "error": None, "ttft": None, "total": None}
    conn = None
    try:
        conn, r = http_.open(url, "/v1/completions", payload, timeout)
        rec["status"] = r.status
        rec["headers"] = {k.lower(): v for k, v in r.getheaders()
                          if k.lower().startswith("x-tailguard")}
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:300]!r}"
            return _finish(rec, t0)
        while True:
            raw = r.readline()
            if not raw:
                break
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                rec["done"] = True
                continue
            try:
                ev = json.loads(data)
            except ValueError:
                rec["error_events"].append(data[:300])
                continue
            if "error" in ev:
                rec["error_events"].append(json.dumps(ev)[:300])
                continue
            for ch in ev.get("choices") or []:
                text = ch.get("text") or ""
                if text:
                    now = time.monotonic()
                    rec["chunks"].append(text)
                    rec["times"].append(now - t0)
                    if rec["ttft"] is None:
                        rec["ttft"] = now - t0
                    if on_chunk:
                        on_chunk(len(rec["chunks"]))
                if ch.get("finish_reason"):
                    rec["finish"] = ch["finish_reason"]
    except Exception as e:  # noqa: BLE001 - a broken stream is a data point
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        if conn is not None:
            conn.close()
    return _finish(rec, t0)


def _finish(rec, t0):
    rec["total"] = time.monotonic() - t0
    rec["text"] = "".join(rec["chunks"])
    return rec


def complete_direct(http, url, prompt, max_tokens, seed) -> dict:
    rec = read_stream(http, url, body(prompt, max_tokens, seed))
    if rec["error"] or not rec["done"]:
        raise RuntimeError(f"direct request to {url} failed: {rec['error'] or 'no [DONE]'}")
    return rec


def flush(http, url, seed):
    """One short unrelated request: llama-cpp-python reuses the KV cache of the longest common
    token prefix with the previous request, so without it a continuation landing on the replica
    that produced the reference would reuse the reference's own KV (decoded token by token) and
    match trivially; a continuation on another replica recomputes the prefix in one batch."""
    complete_direct(http, url, "Hi there", 1, seed)


def first_diff(a: str, b: str) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def metrics(url: str) -> dict:
    return ru.scrape(url, RESUME_FAMILIES) or {}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0)}


def log_lines_since(path: Path, offset: int, limit: int = 40) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return [line[:1200] for line in text.splitlines() if line.strip()][-limit:]


# ---------------------------------------------------------------------------------------------
# One trial.


def trial(a, http, reps: Replicas, gw_base: str, gw_log: Path, i: int, prompt: str,
          rng: random.Random) -> dict:
    t_trial = time.monotonic()
    rec: dict = {"trial": i, "prompt": prompt, "loadavg_before": procs.loadavg()}

    # 1. The uninterrupted greedy answer, straight from each replica (they should agree).
    refs = []
    for k in (0, 1):
        refs.append(complete_direct(http, reps.urls[k], prompt, a.max_tokens, a.seed))
        flush(http, reps.urls[k], a.seed)
    ref = refs[0]
    rec["reference"] = ref["text"]
    rec["reference_chunks"] = len(ref["chunks"])
    rec["reference_finish"] = ref["finish"]
    rec["references_agree"] = refs[0]["text"] == refs[1]["text"]
    if not rec["references_agree"]:
        rec["reference_replica2"] = refs[1]["text"]
    n = len(ref["chunks"])
    if n < 6:
        rec["skipped"] = f"the uninterrupted answer has {n} content chunks (fewer than 6)"
        return rec
    lo, hi = max(1, -(-n // 3)), max(1, (2 * n) // 3)
    k_kill = rng.randint(lo, max(lo, hi))
    rec["kill_after_chunks"] = k_kill

    # 2. The same request through the gateway; kill the generating replica after K chunks.
    m_before = metrics(gw_base + "/metrics")
    log_off = gw_log.stat().st_size if gw_log.exists() else 0
    sampler = CpuSampler([reps.pid(0), reps.pid(1)])
    killed: dict = {}

    def on_chunk(count):
        if count != k_kill or killed:
            return
        k, info = sampler.generating()
        killed.update({"replica": k + 1, "detect": info, "t": time.monotonic()})
        reps.kill(k)
        killed["kill_s"] = round(time.monotonic() - killed["t"], 3)

    got = read_stream(http, gw_base, body(prompt, a.max_tokens, a.seed), on_chunk,
                      a.request_timeout)
    sampler.stop()
    time.sleep(0.3)  # the metrics of the stream's end
    m_after = metrics(gw_base + "/metrics")
    md = delta(m_before, m_after)

    rec["text"] = got["text"]
    rec["chunks"] = len(got["chunks"])
    rec["finish"] = got["finish"]
    rec["done"] = got["done"]
    rec["error"] = got["error"]
    rec["error_events"] = got["error_events"]
    rec["hedge_header"] = got["headers"].get("x-tailguard-hedge")
    rec["complete"] = bool(got["done"] and got["finish"] and not got["error_events"]
                           and not got["error"])
    rec["identical"] = rec["complete"] and got["text"] == ref["text"]
    rec["killed_replica"] = killed.get("replica")
    rec["kill_detect"] = killed.get("detect")
    rec["killed"] = bool(killed)
    rec["resumes"] = int(sum(v for s, v in md.items()
                             if s.startswith("tailguard_resumes_total{") and 'outcome="resumed"' in s))
    rec["resume_events"] = {s: v for s, v in md.items() if s.startswith("tailguard_resumes_total{")}
    rec["extra_attempts"] = int(md.get("tailguard_hedge_sent_total:sum", 0))
    rec["metrics_delta"] = md
    times = got["times"]
    gaps = [(times[j] - times[j - 1], j) for j in range(1, len(times))]
    rec["ttft_s"] = None if got["ttft"] is None else round(got["ttft"], 3)
    rec["total_s"] = round(got["total"], 3)
    rec["pause_s"] = round(max(gaps)[0], 3) if gaps else None
    # Where the continuation's text starts: the chunk after the longest gap that ends after the
    # kill (the broken stream's last chunks may still arrive after it).
    if killed and gaps:
        kill_off = killed["t"] - got["t0"]
        rec["kill_at_s"] = round(kill_off, 3)
        rec["chunks_before_kill"] = sum(t <= kill_off for t in times)
        later = [(g, j) for g, j in gaps if times[j] > kill_off]
        rec["resume_at_chunk"] = max(later)[1] if later else None
        rec["resume_gap_s"] = round(max(later)[0], 3) if later else None
    else:
        rec["resume_at_chunk"] = rec["resume_gap_s"] = None
    if not rec["identical"] and got["text"] != ref["text"]:
        d = first_diff(got["text"], ref["text"])
        rec["first_diff_char"] = d
        rec["first_diff_context"] = {"client": got["text"][max(0, d - 20):d + 40],
                                     "reference": ref["text"][max(0, d - 20):d + 40]}
    rec["gateway_log"] = log_lines_since(gw_log, log_off)
    # The request's log line names each resume (`resumes="replica-1>replica-0:transport"`, when
    # the gateway's build logs it): a check on which replica the CPU time said was generating.
    hops = [m for line in rec["gateway_log"] for m in re.findall(r'resumes="([^"]*)"', line)]
    rec["gateway_resumes"] = hops
    if hops and killed:
        first = hops[0].split(",")[0].split(">")[0]
        rec["kill_matches_gateway_log"] = first == f"replica-{killed['replica'] - 1}"

    # 3. Restart the killed replica on its port; warm it.
    if killed:
        reps.start(killed["replica"] - 1)
        reps.ready(killed["replica"] - 1, http)

    # 4. Why a differing answer differs: the continuation replayed straight to the restarted
    # (cache-flushed) replica, and the prefix's tokens after re-tokenisation.
    if not rec["identical"] and not a.no_diagnose and rec["resume_at_chunk"] and rec["complete"]:
        rec["diagnosis"] = diagnose(a, http, reps.urls[(killed.get("replica") or 1) - 1], prompt,
                                    ref, got, rec["resume_at_chunk"])
    rec["duration_s"] = round(time.monotonic() - t_trial, 1)
    rec["loadavg_after"] = procs.loadavg()
    return rec


def diagnose(a, http, url, prompt, ref, got, at) -> dict:
    prefix = "".join(got["chunks"][:at])
    d = first_diff(got["text"], ref["text"])
    out = {"prefix_chars": len(prefix), "prefix_chunks": at,
           "prefix_is_reference_prefix": ref["text"].startswith(prefix),
           "diff_after_prefix_chars": None if d is None else d - len(prefix)}
    # Replay: the continuation the gateway should have sent (the prompt followed by the text the
    # client had, max_tokens lowered by the chunks sent).
    try:
        replay = complete_direct(http, url, prompt + prefix, max(1, a.max_tokens - at), a.seed)
        flush(http, url, a.seed)
        out["replay_matches_client"] = prefix + replay["text"] == got["text"]
        if not out["replay_matches_client"]:
            out["replay_text"] = replay["text"]
    except RuntimeError as e:
        out["replay_error"] = str(e)
    # Warm replay: the same continuation right after the uninterrupted request on the same
    # replica, no flush: its KV cache then holds the prefix as decoded token by token, and
    # llama-cpp-python evaluates only the prefix's last token. If this one matches the
    # uninterrupted answer while the cold replay does not, the tokens are not the difference:
    # the prefix's batched prefill is.
    try:
        complete_direct(http, url, prompt, a.max_tokens, a.seed)
        warm = complete_direct(http, url, prompt + prefix, max(1, a.max_tokens - at), a.seed)
        flush(http, url, a.seed)
        out["warm_replay_matches_reference"] = prefix + warm["text"] == ref["text"]
    except RuntimeError as e:
        out["warm_replay_error"] = str(e)
    # Re-tokenisation: do the tokens of prompt + prefix, past the prompt's, spell the reference's
    # chunks one for one (llama-cpp-python streams one token per chunk)?
    tp = http.post_json(url + "/extras/tokenize", {"model": "default", "input": prompt})
    tf = http.post_json(url + "/extras/tokenize", {"model": "default", "input": prompt + prefix})
    if tp and tf:
        ids_p, ids_f = tp["tokens"], tf["tokens"]
        out["prompt_tokens_kept"] = ids_f[:len(ids_p)] == ids_p
        pieces = []
        for t in ids_f[len(ids_p):]:
            d = http.post_json(url + "/extras/detokenize", {"model": "default", "tokens": [t]})
            pieces.append(None if d is None else d["text"])
        out["prefix_tokens"] = len(ids_f) - len(ids_p)
        same = out["prompt_tokens_kept"] and pieces == ref["chunks"][:at]
        out["retokenised_same"] = same
        if not same:
            j = next((j for j, (x, y) in enumerate(zip(pieces, ref["chunks"])) if x != y),
                     min(len(pieces), at))
            out["retokenised_first_diff"] = {"token": j, "pieces": pieces[max(0, j - 2):j + 3],
                                             "reference_chunks": ref["chunks"][max(0, j - 2):j + 3]}
    else:
        out["retokenised_same"] = None
    if out.get("replay_matches_client") and out.get("retokenised_same") is False:
        out["cause"] = "re-tokenisation of the prefix (the continuation is what the server gives)"
    elif out.get("replay_matches_client") and out.get("retokenised_same") \
            and out.get("warm_replay_matches_reference"):
        out["cause"] = ("same tokens, different continuation: numerics (the prefix prefilled in "
                        "one batch, not decoded token by token; with it decoded token by token "
                        "the same request gives the uninterrupted answer)")
    elif out.get("replay_matches_client") and out.get("retokenised_same") and REPEAT_PENALTY != 1.0:
        out["cause"] = ("same tokens, different continuation even on the prefix's own KV: the "
                        "repeat penalty (the server's counts only the tokens it generated)")
    elif out.get("replay_matches_client") and out.get("retokenised_same"):
        out["cause"] = "same tokens, different continuation (not explained)"
    elif out.get("replay_matches_client") is False:
        out["cause"] = "the client's text is not prefix + the server's continuation (gateway splice?)"
    else:
        out["cause"] = "unknown"
    return out


# ---------------------------------------------------------------------------------------------
# Summary.


def summarise(trials: list[dict]) -> dict:
    """Counts over the measured trials (not skipped for a short answer, no driver error)."""
    done = [t for t in trials if "trial_error" not in t and "skipped" not in t]
    pauses = [t["pause_s"] for t in done if t.get("pause_s") is not None and t.get("killed")]
    totals = [t["total_s"] for t in done if t.get("total_s") is not None]
    causes: dict[str, int] = {}
    for t in done:
        if not t.get("identical") and t.get("diagnosis"):
            c = t["diagnosis"]["cause"]
            causes[c] = causes.get(c, 0) + 1
    return {
        "trials": len(trials),
        "measured": len(done),
        "skipped": [f"trial {t['trial']}: {t['skipped']}" for t in trials if "skipped" in t],
        "errors": [f"trial {t['trial']}: {t['trial_error']}" for t in trials if "trial_error" in t],
        "killed": sum(bool(t.get("killed")) for t in done),
        "kill_detection_clear": sum(bool((t.get("kill_detect") or {}).get("clear")) for t in done),
        "kill_matches_gateway_log": sum(bool(t.get("kill_matches_gateway_log")) for t in done),
        "resumed": sum(t.get("resumes", 0) > 0 for t in done),
        "complete": sum(bool(t.get("complete")) for t in done),
        "identical": sum(bool(t.get("identical")) for t in done),
        "complete_not_identical": sum(bool(t.get("complete")) and not t.get("identical") for t in done),
        "references_agree": sum(bool(t.get("references_agree")) for t in done),
        "differing_causes": causes,
        "diff_after_prefix_chars": sorted(t["diagnosis"]["diff_after_prefix_chars"] for t in done
                                          if (t.get("diagnosis") or {}).get("diff_after_prefix_chars") is not None),
        "median_pause_s": round(statistics.median(pauses), 3) if pauses else None,
        "max_pause_s": max(pauses) if pauses else None,
        "median_total_s": round(statistics.median(totals), 3) if totals else None,
    }


def fmt_s(x) -> str:
    return "–" if x is None else f"{x:.2f} s"


def markdown(result) -> str:
    s, c = result["summary"], result["config"]
    lines = [
        f"\n**Resume after a SIGKILL mid-stream** (`tailguard-gateway --resume on`, 2 llama-cpp-python "
        f"replicas, SmolLM2-135M-Instruct Q4, `/v1/completions`, temperature 0, max_tokens "
        f"{c['max_tokens']}, repeat_penalty {c['repeat_penalty']:g}, seed {c['seed']})\n",
        "| # | instruction | K | killed | continuation from chunk | resumes | complete | identical "
        "| first diff (char) | pause | total |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in result["trials"]:
        head = f"| {t['trial']} | {t.get('instruction', '?')} |"
        if "trial_error" in t or "skipped" in t:
            why = t.get("trial_error") or t.get("skipped")
            lines.append(f"{head} {'error' if 'trial_error' in t else 'skipped'}: {why[:100]} |"
                         + " |" * 8)
            continue
        lines.append(
            f"{head} {t['kill_after_chunks']} | "
            f"{'replica ' + str(t['killed_replica']) if t['killed'] else 'no'} | "
            f"{t.get('resume_at_chunk') if t.get('resumes') else '–'} | {t['resumes']} | "
            f"{'yes' if t['complete'] else '**no**'} | {'yes' if t['identical'] else 'no'} | "
            f"{t.get('first_diff_char', '–')} | {fmt_s(t['pause_s'])} | {fmt_s(t['total_s'])} |")
    n = s["measured"]
    lines += [
        "",
        f"Complete: **{s['complete']}/{n}**; identical to the uninterrupted greedy answer: "
        f"**{s['identical']}/{n}**; resumed: {s['resumed']}/{n}; pause median "
        f"{fmt_s(s['median_pause_s'])}, max {fmt_s(s['max_pause_s'])}; total median "
        f"{fmt_s(s['median_total_s'])}. The two replicas' own greedy answers agreed in "
        f"{s['references_agree']}/{n}; the generating replica was clear from its CPU time in "
        f"{s['kill_detection_clear']}/{s['killed']} (the gateway's log named it as the broken "
        f"stream's replica in {s['kill_matches_gateway_log']}/{s['killed']}).",
    ]
    if s["skipped"] or s["errors"]:
        lines.append(f"Not measured: {len(s['skipped'])} skipped, {len(s['errors'])} driver errors.")
    if s["differing_causes"]:
        lines.append("Differing answers: " + "; ".join(f"{v}× {k}" for k, v in s["differing_causes"].items()) + ".")
    if s["diff_after_prefix_chars"]:
        lines.append("First difference, characters after the continuation's start: "
                     + ", ".join(map(str, s["diff_after_prefix_chars"])) + ".")
    for t in result["trials"]:
        if "first_diff_context" in t:
            ctx = t["first_diff_context"]
            lines.append(f"* trial {t['trial']}, char {t['first_diff_char']}: client "
                         f"{ctx['client']!r} vs uninterrupted {ctx['reference']!r}")
    return "\n".join(lines)


def git_state() -> dict:
    """The commit, and whether the crates had uncommitted changes (the binary may be built
    from them)."""
    def run(*cmd):
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
    dirty = run("status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock")
    return {"commit": run("rev-parse", "HEAD"), "crates_dirty": None if dirty is None else bool(dirty)}


def main(argv):
    a = parse_args(argv)
    venv, gguf = bootstrap(a)
    global REPEAT_PENALTY
    REPEAT_PENALTY = a.repeat_penalty
    
    procs.install_cleanup()
    gw_bin, gw_err = ru.gateway_binary(a, True)
    if gw_err:
        sys.exit(f"resume_kill: no gateway: {gw_err}")
    log_dir = a.log_dir or Path(f"/tmp/tailguard-real-resume-{time.strftime('%Y%m%d-%H%M%S')}")
    log_dir.mkdir(parents=True, exist_ok=True)
    gw_argv = None
    result = {
        "bench": "real_resume",
        "command": [sys.argv[0], *argv],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": procs.loadavg(),
        "cpus": os.cpu_count(),
        "versions": ru.versions(venv),
        "venv": str(venv), "model": str(gguf), "gateway_bin": str(gw_bin),
        "gateway_bin_built": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(gw_bin.stat().st_mtime)),
        "git": git_state(),
        "log_dir": str(log_dir),
        "config": {"trials": a.trials, "max_tokens": a.max_tokens, "seed": a.seed,
                   "repeat_penalty": a.repeat_penalty,
                   "settle_s": a.settle, "batch_threads": a.batch_threads,
                   "gateway_flags": ["--resume", "on", *a.extra_flags],
                   "request_timeout_s": a.request_timeout},
        "trials": [],
    }
    t_start = time.monotonic()
    interrupted = None
    http = Http(a.request_timeout)
    try:
        reps = Replicas(a, venv, gguf, log_dir)
        for k in (0, 1):
            reps.start(k)
        for k in (0, 1):
            reps.ready(k, http)
        port = procs.free_port()
        gw_argv = [str(gw_bin), "--listen", f"127.0.0.1:{port}", "--upstream", reps.urls[0],
                   "--upstream", reps.urls[1], "--resume", "on", *a.extra_flags]
        result["gateway_argv"] = gw_argv
        gw = procs.Child("tailguard", gw_argv, log_dir)
        gw_base = f"http://127.0.0.1:{port}"
        procs.wait_http(gw, gw_base + "/healthz", timeout=60)
        # One uninterrupted request through the gateway first (its first-token estimates).
        read_stream(http, gw_base, body("Hello", 2, a.seed))
        rng = random.Random(a.seed)
        for i, instruction in enumerate(instructions(a.trials), 1):
            print(f"resume_kill: trial {i}/{a.trials}: {instruction}", file=sys.stderr)
            prompt = TEMPLATE.format(instruction)
            try:
                t = trial(a, http, reps, gw_base, gw.log_path, i, prompt, rng)
                t["instruction"] = instruction
            except RuntimeError as e:
                t = {"trial": i, "instruction": instruction, "prompt": prompt,
                     "trial_error": str(e)[:500]}
                print(f"resume_kill: trial {i} failed: {e}", file=sys.stderr)
                for k in (0, 1):  # bring back whatever died
                    if reps.children[k] is None or not reps.children[k].alive():
                        reps.start(k)
                        reps.ready(k, http)
            result["trials"].append(t)
            if "skipped" in t:
                print(f"  skipped: {t['skipped']}", file=sys.stderr)
            elif "trial_error" not in t:
                print(f"  killed replica {t['killed_replica']} after {t['kill_after_chunks']} chunks; "
                      f"resumes {t['resumes']}; complete {t['complete']}; identical {t['identical']}"
                      f"{'' if t['identical'] else ' (first diff at char ' + str(t.get('first_diff_char')) + ')'}; "
                      f"pause {fmt_s(t['pause_s'])}; total {fmt_s(t['total_s'])}"
                      + (f"; error {t['error'] or t['error_events']}" if not t["complete"] else ""),
                      file=sys.stderr)
            if i < a.trials:
                time.sleep(a.settle)
    except (KeyboardInterrupt, SystemExit) as e:
        interrupted = type(e).__name__ + (f": {e}" if str(e) else "")
        print(f"resume_kill: stopped early ({interrupted}); writing what was measured", file=sys.stderr)
    finally:
        procs.kill_all()
    result["interrupted"] = interrupted
    result["loadavg_end"] = procs.loadavg()
    result["duration_s"] = round(time.monotonic() - t_start, 1)
    result["summary"] = summarise(result["trials"])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(markdown(result))
    print(f"\nresults: {a.out}; logs: {log_dir}; load average {result['loadavg_start']} → "
          f"{result['loadavg_end']}; {result['duration_s']} s")
    if interrupted and interrupted.startswith("KeyboardInterrupt"):
        return 130
    if interrupted and interrupted.startswith("SystemExit"):
        return 143
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
