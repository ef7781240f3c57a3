"""The gateway driven by the official `openai` Python SDK (run by scripts/e2e.sh): chat,
completions and the Responses API, and the un-hedged pass-through of other `/v1/*` paths.

The gateway runs over embedded mock replicas with tests/python/gateway.toml. Environment:
TAILGUARD_GATEWAY_URL (e.g. http://127.0.0.1:8080) and TAILGUARD_UPSTREAM_URL (a healthy
mock replica, for comparing content with what the upstream itself sends).
"""

import os
import time

import httpx
import openai
import pytest

GATEWAY = os.environ["TAILGUARD_GATEWAY_URL"]
UPSTREAM = os.environ["TAILGUARD_UPSTREAM_URL"]
MODEL = "mock-llm"
MESSAGES = [{"role": "user", "content": "Hello!"}]
# The mock's first eight tokens (crates/mock/src/wire.rs).
SCRIPT = "ttft=10ms,tokens=8,gap=2ms"


def client(base: str) -> openai.OpenAI:
    # No retries: a 429 must reach the test, not be retried away.
    return openai.OpenAI(base_url=f"{base}/v1", api_key="test", max_retries=0, timeout=15.0)


def stream_text(base: str, headers: dict) -> tuple[str, list, httpx.Headers]:
    raw = client(base).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers=headers
    )
    finish = []
    text = []
    for chunk in raw.parse():
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    return "".join(text), finish, raw.headers


def metric(name: str, label: str = "") -> float:
    """The sum of the samples of `name` (those with `label`, e.g. `route="other"`, when given)."""
    body = httpx.get(f"{GATEWAY}/metrics", timeout=5.0).text
    total = 0.0
    for line in body.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_models_and_health():
    assert httpx.get(f"{GATEWAY}/healthz", timeout=5.0).json() == {"status": "ok"}
    ids = [m.id for m in client(GATEWAY).models.list()]
    assert ids == [MODEL]


def test_streamed_chat_is_the_upstreams_stream():
    want, want_finish, _ = stream_text(UPSTREAM, {"x-mock-script": SCRIPT})
    got, got_finish, headers = stream_text(GATEWAY, {"x-mock-script": SCRIPT})
    assert want  # the upstream did send tokens
    assert got == want
    assert got_finish == want_finish == ["stop"]
    assert headers["x-request-id"]
    assert headers["x-tailguard-hedge"] == "attempts=1; winner=0"


def test_completions_route():
    out = client(GATEWAY).completions.create(
        model=MODEL, prompt="Hello", stream=True, extra_headers={"x-mock-script": SCRIPT}
    )
    text = "".join(c.choices[0].text for c in out if c.choices)
    want = client(UPSTREAM).completions.create(
        model=MODEL, prompt="Hello", stream=True, extra_headers={"x-mock-script": SCRIPT}
    )
    assert text == "".join(c.choices[0].text for c in want if c.choices)
    assert text


def test_hedge_bypasses_a_slow_primary():
    # The primary attempt (x-tailguard-attempt: 0) takes 3 s to its first token; the backup,
    # sent after the 50 ms hedge delay to another replica, is fast and wins.
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": SCRIPT})
    won_before = metric("tailguard_hedge_won_total")
    started = time.monotonic()
    got, finish, headers = stream_text(
        GATEWAY, {"x-mock-script": SCRIPT, "x-mock-script-0": "ttft=3s"}
    )
    assert time.monotonic() - started < 2.5  # not the primary's 3 s
    assert got == want  # one clean stream: nothing of the losing attempt leaks in
    assert finish == ["stop"]
    assert headers["x-tailguard-hedge"] == "attempts=2; winner=1"
    assert metric("tailguard_hedge_won_total") == won_before + 1


def test_congested_replica_is_bypassed():
    # One of the three replicas is congested (first token after 3 s). Load-aware routing learns
    # to avoid it and the hedge answers any primary that still lands there from another replica,
    # so no request waits for it. Which of the two bypasses it depends on the routing's random
    # choices, so only the user-visible outcome is asserted.
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": SCRIPT})
    for _ in range(3):
        started = time.monotonic()
        got, finish, headers = stream_text(GATEWAY, {})
        assert time.monotonic() - started < 2.5  # not the congested replica's 3 s
        assert got == want
        assert finish == ["stop"]
        assert headers["x-tailguard-hedge"] in ("attempts=1; winner=0", "attempts=2; winner=1")


def test_idle_timeout_raises_api_error():
    # Three tokens, then the upstream stalls forever behind keepalive comments; the gateway's
    # 200 ms idle timeout ends the stream with an in-band error event.
    headers = {"x-mock-script": SCRIPT + ",stall_after=3,keepalive=20ms"}
    stream = client(GATEWAY).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers=headers
    )
    text = []
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
    assert not isinstance(err.value, openai.APIStatusError)  # in-band, after a 200
    assert err.value.body["code"] == "idle_timeout"
    assert err.value.body["type"] == "timeout_error"
    assert "idle" in err.value.message
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": "ttft=10ms,tokens=3,gap=2ms"})
    assert "".join(text) == want  # the three tokens, then the error


def test_a_client_deadline_header_ends_the_stream_in_band():
    # The SDK's own `timeout` sends no header, so the deadline is set explicitly: 0.5 s for a
    # stream that would take 2 s. The gateway ends it at the deadline with an in-band error.
    headers = {"x-mock-script": "ttft=10ms,tokens=20,gap=100ms", "x-request-timeout": "0.5"}
    start = time.monotonic()
    stream = client(GATEWAY).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers=headers
    )
    text = []
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
    elapsed = time.monotonic() - start
    assert not isinstance(err.value, openai.APIStatusError)  # in-band, after a 200
    assert err.value.body["code"] == "deadline_exceeded"
    assert err.value.body["type"] == "timeout_error"
    assert 0 < len(text) < 20
    assert elapsed < 1.5, elapsed


def test_admission_rejects_with_retry_after():
    # Capacity 2, no queue: two long streams hold both permits until they end.
    slow = {"x-mock-script": "ttft=10ms,tokens=2000,gap=20ms"}
    c = client(GATEWAY)
    held = [
        c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, extra_headers=slow)
        for _ in range(2)
    ]
    try:
        with pytest.raises(openai.RateLimitError) as err:
            c.chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=True, extra_headers={"x-mock-script": SCRIPT}
            )
        res = err.value.response
        assert res.status_code == 429
        assert int(res.headers["retry-after"]) >= 1
        assert err.value.body["code"] == "queue_full"
    finally:
        for s in held:
            s.close()
    # The permits come back when the clients go away (bounded wait for the disconnects).
    for _ in range(100):
        try:
            got, _, _ = stream_text(GATEWAY, {"x-mock-script": SCRIPT})
            break
        except openai.RateLimitError:
            time.sleep(0.02)
    else:
        pytest.fail("the permits of disconnected clients were not released")
    assert got


# ---- issue 34: usage in the stream, and a tenant's token budget -----------------------------


def test_stream_options_include_usage_reports_the_streams_usage():
    out = client(GATEWAY).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-mock-script": SCRIPT},
    )
    usage = [chunk.usage for chunk in out if chunk.usage]
    assert len(usage) == 1
    assert usage[0].completion_tokens == 8


def test_a_tenant_over_its_token_budget_gets_429_with_retry_after():
    # Tenant `tiny` may use 30 output tokens a minute (tests/python/gateway.toml).
    c = client(GATEWAY)
    tiny = {"x-tenant": "tiny"}
    # More than the whole budget never fits: 429, no Retry-After.
    with pytest.raises(openai.RateLimitError) as err:
        c.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, max_tokens=100, extra_headers=tiny
        )
    assert "retry-after" not in err.value.response.headers
    # A slow stream holds 28 of the 30 while it runs: 10 more wait for 8 to refill (0.5/s).
    slow = {**tiny, "x-mock-script": "ttft=10ms,tokens=8,gap=300ms"}
    held = c.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, max_tokens=28, extra_headers=slow
    )
    try:
        next(iter(held))
        with pytest.raises(openai.RateLimitError) as err:
            c.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                stream=True,
                max_tokens=10,
                extra_headers={**tiny, "x-mock-script": SCRIPT},
            )
        assert err.value.response.status_code == 429
        assert 1 <= int(err.value.response.headers["retry-after"]) <= 16
        assert err.value.body["code"] == "token_budget_exceeded"
    finally:
        held.close()
    # Another tenant is not held back by tiny's budget.
    got, _, _ = stream_text(GATEWAY, {"x-tenant": "another", "x-mock-script": SCRIPT})
    assert got


# ---- issue 15: every stream ends truthfully, and the SDK raises its own error type ---------


def read_stream(headers: dict) -> str:
    stream = client(GATEWAY).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers=headers
    )
    text = []
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
    return "".join(text)


def test_every_attempt_reset_before_a_token_is_a_502_not_an_empty_reply():
    # Both attempts send the role chunk, then the connection is reset.
    with pytest.raises(openai.InternalServerError) as err:
        read_stream({"x-mock-script": SCRIPT + ",reset=0"})
    assert err.value.status_code == 502
    assert err.value.body["type"] == "upstream_error"


def test_junk_on_every_attempt_is_a_502_not_an_empty_success():
    for fault in ["garbage=not_json", "garbage=bad_utf8", "half_event=0"]:
        with pytest.raises(openai.InternalServerError) as err:
            read_stream({"x-mock-script": f"{SCRIPT},{fault}"})
        assert err.value.status_code == 502, fault


def test_a_truncated_stream_raises_api_error_after_its_tokens():
    # Three tokens, then the body ends cleanly without `[DONE]`.
    text = []
    stream = client(GATEWAY).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-mock-script": "ttft=10ms,tokens=3,gap=2ms,no_done=true"},
    )
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
    assert not isinstance(err.value, (openai.APIStatusError, openai.APIConnectionError))
    assert err.value.body["code"] == "upstream_error_truncated"
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": "ttft=10ms,tokens=3,gap=2ms"})
    assert "".join(text) == want


def test_a_reset_mid_stream_raises_api_error_not_a_connection_error():
    with pytest.raises(openai.APIError) as err:
        read_stream({"x-mock-script": "ttft=10ms,tokens=8,gap=2ms,reset=3"})
    assert not isinstance(err.value, (openai.APIStatusError, openai.APIConnectionError))
    assert err.value.body["code"] == "upstream_error_transport"


# ---- issue 30: no junk passed on, no empty answer to a stream ---------------------------------


def test_junk_before_the_primarys_tokens_yields_the_backups_text_with_no_exception():
    # The primary sends `data: this is not json at all` and `data: {{{{` before its tokens:
    # the hedge fails it over at once, and the SDK reads the backup's clean stream.
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": SCRIPT})
    got, finish, headers = stream_text(
        GATEWAY, {"x-mock-script": SCRIPT, "x-mock-script-0": SCRIPT + ",junk_before=2"}
    )
    assert got == want
    assert finish == ["stop"]
    assert headers["x-tailguard-hedge"] == "attempts=2; winner=1"


def test_junk_on_every_attempt_is_an_api_error_not_a_json_decode_error():
    with pytest.raises(openai.InternalServerError) as err:
        read_stream({"x-mock-script": SCRIPT + ",junk_before=2"})
    assert err.value.status_code == 502
    assert err.value.body["code"] == "upstream_malformed"
    assert "not a JSON object" in err.value.message


def test_junk_after_the_first_token_raises_api_error_after_it():
    text = []
    stream = client(GATEWAY).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-mock-script": SCRIPT + ",junk_after=1"},
    )
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
    assert not isinstance(err.value, (openai.APIStatusError, openai.APIConnectionError))
    assert err.value.body["code"] == "upstream_error_protocol"
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": "ttft=10ms,tokens=1,gap=2ms"})
    assert "".join(text) == want  # the first token, then the error


def test_a_json_reply_to_a_stream_is_failed_over_or_a_502_never_an_empty_answer():
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": SCRIPT})
    got, finish, headers = stream_text(
        GATEWAY, {"x-mock-script": SCRIPT, "x-mock-script-0": SCRIPT + ",json_reply=true"}
    )
    assert got == want
    assert finish == ["stop"]
    assert headers["x-tailguard-hedge"] == "attempts=2; winner=1"
    with pytest.raises(openai.InternalServerError) as err:
        read_stream({"x-mock-script": SCRIPT + ",json_reply=true"})
    assert err.value.status_code == 502
    assert err.value.body["code"] == "upstream_not_a_stream"
    # Not asking to stream: the JSON answer as it is.
    out = client(GATEWAY).chat.completions.create(
        model=MODEL, messages=MESSAGES, extra_headers={"x-mock-script": SCRIPT + ",json_reply=true"}
    )
    assert out.choices[0].message.content == want


def test_a_non_json_body_is_refused_with_415():
    res = httpx.post(
        f"{GATEWAY}/v1/chat/completions",
        content="hello",
        headers={"content-type": "text/plain"},
        timeout=5.0,
    )
    assert res.status_code == 415
    assert res.json()["error"]["code"] == "unsupported_media_type"


# ---- issue 16: the Responses API and the un-hedged pass-through ----------------------------


def responses_text(base: str, headers: dict) -> tuple[str, list, httpx.Headers]:
    raw = client(base).responses.with_raw_response.create(
        model=MODEL, input="Hello!", stream=True, extra_headers=headers
    )
    text = []
    ended = []
    for event in raw.parse():
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete", "response.failed"):
            ended.append(event.response)
    return "".join(text), ended, raw.headers


def test_streamed_responses_are_the_upstreams_stream():
    want, _, _ = responses_text(UPSTREAM, {"x-mock-script": SCRIPT})
    got, ended, headers = responses_text(GATEWAY, {"x-mock-script": SCRIPT})
    assert want
    assert got == want
    assert [r.status for r in ended] == ["completed"]
    assert ended[0].output_text == got
    assert headers["x-tailguard-hedge"] == "attempts=1; winner=0"


def test_the_responses_stream_helper_assembles_the_answer():
    # The SDK's stream helper checks the event order (created, output item, content part,
    # deltas) while it accumulates the response.
    with client(GATEWAY).responses.stream(
        model=MODEL, input="Hello!", extra_headers={"x-mock-script": SCRIPT}
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(deltas)
    assert final.usage.output_tokens == 8


def test_responses_hedge_bypasses_a_slow_primary():
    want, _, _ = responses_text(UPSTREAM, {"x-mock-script": SCRIPT})
    started = time.monotonic()
    got, ended, headers = responses_text(
        GATEWAY, {"x-mock-script": SCRIPT, "x-mock-script-0": "ttft=3s"}
    )
    assert time.monotonic() - started < 2.5
    assert got == want
    assert [r.status for r in ended] == ["completed"]
    assert headers["x-tailguard-hedge"] == "attempts=2; winner=1"


def test_a_non_streamed_response_is_not_hedged():
    # `stream` absent: the request facts say non-streamed, so the hedge leaves it alone.
    raw = client(GATEWAY).responses.with_raw_response.create(
        model=MODEL, input="Hello!", max_output_tokens=3, extra_headers={"x-mock-script": SCRIPT}
    )
    res = raw.parse()
    assert res.status == "completed"
    assert res.output_text == "Hello there,"
    assert "x-tailguard-hedge" not in raw.headers


def test_other_v1_paths_pass_through_unhedged_as_route_other():
    before = metric("tailguard_requests_total", 'route="other"')
    res = httpx.get(f"{GATEWAY}/v1/files", timeout=5.0)
    # The mock has no such route: its own 404 comes back through the gateway.
    assert res.status_code == 404
    assert res.json()["error"]["message"] == "no such route"
    assert "x-tailguard-hedge" not in res.headers
    assert res.headers["x-request-id"]
    assert metric("tailguard_requests_total", 'route="other"') == before + 1
