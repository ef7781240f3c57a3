"""The gateway's `POST /v1/messages` driven by the official `anthropic` Python SDK (run by
scripts/e2e.sh, over the embedded mock replicas of tests/python/gateway.toml).

Environment: TAILGUARD_GATEWAY_URL and TAILGUARD_UPSTREAM_URL (a healthy mock replica, for
comparing content with what the upstream itself sends).
"""

import os
import time

import anthropic
import httpx
import pytest

GATEWAY = os.environ["TAILGUARD_GATEWAY_URL"]
UPSTREAM = os.environ["TAILGUARD_UPSTREAM_URL"]
MODEL = "mock-llm"
MESSAGES = [{"role": "user", "content": "Hello!"}]
SCRIPT = "ttft=10ms,tokens=8,gap=2ms"


def client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="test", max_retries=0, timeout=15.0)


def stream_text(base: str, headers: dict, max_tokens: int = 64) -> tuple[str, list, httpx.Headers]:
    raw = client(base).messages.with_raw_response.create(
        model=MODEL, max_tokens=max_tokens, messages=MESSAGES, stream=True, extra_headers=headers
    )
    text = []
    stops = []
    for event in raw.parse():
        if event.type == "content_block_delta":
            text.append(event.delta.text)
        elif event.type == "message_delta":
            stops.append(event.delta.stop_reason)
    return "".join(text), stops, raw.headers


def test_streamed_messages_are_the_upstreams_stream():
    want, want_stops, _ = stream_text(UPSTREAM, {"x-mock-script": SCRIPT})
    got, stops, headers = stream_text(GATEWAY, {"x-mock-script": SCRIPT})
    assert want
    assert got == want
    assert stops == want_stops == ["end_turn"]
    assert headers["x-request-id"]
    assert headers["x-tailguard-hedge"] == "attempts=1; winner=0"


def test_the_stream_helper_assembles_the_message():
    with client(GATEWAY).messages.stream(
        model=MODEL, max_tokens=3, messages=MESSAGES, extra_headers={"x-mock-script": SCRIPT}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there,"
    assert final.content[0].text == text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 3


def test_hedge_bypasses_a_slow_primary():
    want, _, _ = stream_text(UPSTREAM, {"x-mock-script": SCRIPT})
    started = time.monotonic()
    got, stops, headers = stream_text(
        GATEWAY, {"x-mock-script": SCRIPT, "x-mock-script-0": "ttft=3s"}
    )
    assert time.monotonic() - started < 2.5  # not the primary's 3 s
    assert got == want
    assert stops == ["end_turn"]
    assert headers["x-tailguard-hedge"] == "attempts=2; winner=1"


def test_idle_timeout_is_an_anthropic_error_event():
    # Three tokens, then pings only: the gateway's 200 ms idle timeout ends the stream with an
    # `event: error` in Anthropic's shape, which the SDK raises.
    headers = {"x-mock-script": SCRIPT + ",stall_after=3,keepalive=20ms"}
    stream = client(GATEWAY).messages.create(
        model=MODEL, max_tokens=64, messages=MESSAGES, stream=True, extra_headers=headers
    )
    text = []
    with pytest.raises(anthropic.APIError) as err:
        for event in stream:
            if event.type == "content_block_delta":
                text.append(event.delta.text)
    assert err.value.body["error"]["type"] == "timeout_error"
    assert "idle" in err.value.body["error"]["message"]
    assert "".join(text) == "Hello there,"


def test_malformed_json_is_a_400():
    res = httpx.post(
        f"{GATEWAY}/v1/messages",
        content="{not json",
        headers={"content-type": "application/json"},
        timeout=5.0,
    )
    assert res.status_code == 400
    assert res.json()["error"]["code"] == "invalid_json"
