"""The bench's clients, on the official `openai` SDK (async, `max_retries=0`).

* `open_loop`: Poisson arrivals with scheduled send times, fixed before the run (same seed, same
  schedule for every strategy of a round). Each request is a short streamed chat completion; its
  time to first token (TTFT) is measured from its *scheduled* send time to the first delta that
  carries content (no coordinated omission). A stream that ends cleanly without content is
  `empty` (a failure the server hid); an exception is `failed`.
* `busy_client`: the traffic the gateway cannot see, a closed loop of long prompts sent straight
  to one replica, each one different from its first token (no KV-cache prefix reuse).
"""

from __future__ import annotations

import asyncio
import random
import time

from openai import AsyncOpenAI, Timeout

WORDS = (
    "river stone lantern harbor meadow copper signal window orchard thunder canvas market "
    "compass feather glacier ribbon saddle timber violet whistle anchor basket candle dragon "
    "ember forest garden hollow island jacket kettle ladder marble needle ocean pepper quarry"
).split()


def client(base_url: str, timeout: float) -> AsyncOpenAI:
    """An SDK client that never retries; its default pool allows 1,000 connections."""
    return AsyncOpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=Timeout(timeout, connect=5.0),
    )


def schedule(n: int, rate: float, seed: int) -> list[float]:
    """Send offsets (seconds from the start) of `n` Poisson arrivals at `rate` per second."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


async def one_request(cli: AsyncOpenAI, i: int, t_sched: float, max_tokens: int) -> dict:
    """Waits until the scheduled time, sends request `i`, and classifies its outcome."""
    await asyncio.sleep(max(0.0, t_sched - time.monotonic()))
    sent_late = time.monotonic() - t_sched
    rec = {"i": i, "ttft": None, "total": None, "outcome": None, "finish": None,
           "chunks": 0, "error": None, "send_lag": round(sent_late, 4)}
    try:
        stream = await cli.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": f"Request {i}. Name one colour."}],
            max_tokens=max_tokens,
            stream=True,
        )
        async with stream:
            async for chunk in stream:
                rec["chunks"] += 1
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                if choice.delta is not None and choice.delta.content and rec["ttft"] is None:
                    rec["ttft"] = time.monotonic() - t_sched
                if choice.finish_reason:
                    rec["finish"] = choice.finish_reason
        rec["outcome"] = "served" if rec["ttft"] is not None else "empty"
    except asyncio.CancelledError:
        rec["outcome"], rec["error"] = "failed", "cancelled at the run's deadline"
    except Exception as e:  # noqa: BLE001 - every failure is a data point
        rec["outcome"] = "failed"
        status = getattr(e, "status_code", None)
        rec["error"] = f"{type(e).__name__}" + (f" {status}" if status else "") + f": {str(e)[:160]}"
    rec["total"] = time.monotonic() - t_sched
    return rec


async def open_loop(pick, offsets: list[float], max_tokens: int, deadline: float) -> list[dict]:
    """Runs the schedule; `pick(i)` gives the client for request `i`. Bounded by `deadline`."""
    start = time.monotonic() + 0.2
    tasks = [
        asyncio.create_task(one_request(pick(i), i, start + off, max_tokens))
        for i, off in enumerate(offsets)
    ]
    done, pending = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [t.result() for t in tasks]


def long_prompt(rng: random.Random, words: int) -> str:
    head = f"Job {rng.randrange(10**9)}: summarise the following notes in one line."
    return head + " " + " ".join(rng.choice(WORDS) for _ in range(words))


async def busy_client(cli: AsyncOpenAI, stop: asyncio.Event, words: int, max_tokens: int,
                      seed: int, stats: dict) -> None:
    """Closed loop of long prompts straight to one replica until `stop` is set."""
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            stream = await cli.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": long_prompt(rng, words)}],
                max_tokens=max_tokens,
                stream=True,
            )
            async with stream:
                async for _ in stream:
                    if stop.is_set():
                        break
            stats["done"] = stats.get("done", 0) + 1
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - interrupted or refused: keep the replica busy
            stats["errors"] = stats.get("errors", 0) + 1
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.02)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; `inf` entries (requests without content) count as the slowest."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-q * len(v) // 1)) - 1))
    return v[k]


def summarise(records: list[dict]) -> dict:
    served = [r for r in records if r["outcome"] == "served"]
    ttft = [r["ttft"] for r in served]
    all_ttft = [r["ttft"] if r["outcome"] == "served" else float("inf") for r in records]
    errors: dict[str, int] = {}
    for r in records:
        if r["outcome"] == "failed":
            key = (r["error"] or "?").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    p99_all = percentile(all_ttft, 0.99)
    return {
        "requests": len(records),
        "served": len(served),
        "failed": sum(r["outcome"] == "failed" for r in records),
        "empty": sum(r["outcome"] == "empty" for r in records),
        "served_without_finish_reason": sum(r["finish"] is None for r in served),
        "p50_ttft_s": _r(percentile(ttft, 0.50)),
        "p99_ttft_s": _r(percentile(ttft, 0.99)),
        "max_ttft_s": _r(max(ttft) if ttft else None),
        # null with p99_all_inf true: more than 1% of the requests got no content.
        "p99_ttft_all_s": None if p99_all is None or p99_all == float("inf") else _r(p99_all),
        "p99_ttft_all_inf": p99_all == float("inf"),
        "max_send_lag_s": _r(max((r["send_lag"] for r in records), default=None)),
        "errors": errors,
    }


def _r(x):
    return None if x is None else round(x, 4)
