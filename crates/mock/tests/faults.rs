//! The stream faults (script keys) and the replica-wide behaviours of real servers
//! (`ReplicaOptions`), over real loopback HTTP on a paused clock. Raw sockets where the
//! difference is in the transport: FIN or RST, with or without the terminating chunk.

mod common;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use tailguard_mock::{MockServer, Outcome, ReplicaOptions, SCRIPT_HEADER, Script};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// The zero-length chunk that ends a chunked HTTP/1.1 body.
const LAST_CHUNK: &[u8] = b"\r\n0\r\n\r\n";

/// Everything the server sends on one HTTP/1.1 connection (`connection: close`), and how the
/// connection ended: `None` for a FIN, else the read error.
async fn raw(
    addr: SocketAddr,
    path: &str,
    body: &str,
    script: &str,
) -> (Vec<u8>, Option<ErrorKind>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: mock\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{SCRIPT_HEADER}: {script}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    read_to_end(&mut s).await
}

async fn read_to_end(s: &mut TcpStream) -> (Vec<u8>, Option<ErrorKind>) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Some(e.kind())),
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn chat(server: &MockServer, script: &str) -> Collected {
    collect(
        &client(),
        post(
            &server.url(),
            "/v1/chat/completions",
            CHAT_STREAM,
            &[(SCRIPT_HEADER, script)],
        ),
    )
    .await
}

async fn outcome(server: &MockServer, i: usize) -> Outcome {
    server.wait_idle().await;
    server.stats().log[i].outcome
}

#[tokio::test(start_paused = true)]
async fn reset_after_the_role_chunk_closes_or_resets_the_connection() {
    let server = MockServer::start(Script::new()).await.unwrap();
    // FIN: the role chunk arrives, no content, and no terminating chunk.
    let (bytes, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "reset=0",
    )
    .await;
    assert_eq!(err, None, "a clean FIN");
    assert!(contains(&bytes, b"\"role\":\"assistant\""));
    assert!(!contains(&bytes, b"\"content\""));
    assert!(!bytes.ends_with(LAST_CHUNK));
    assert_eq!(outcome(&server, 0).await, Outcome::ResetAfterTokens(0));
    // RST: connection reset by peer.
    let (_, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "reset=0,rst=true",
    )
    .await;
    assert_eq!(err, Some(ErrorKind::ConnectionReset));
    let (_, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "reset=before_headers,rst=true",
    )
    .await;
    assert_eq!(err, Some(ErrorKind::ConnectionReset));
    server.wait_idle().await;
    assert_eq!(server.stats().resets, 3);
    // HTTP/2: the stream is reset, the connection lives on.
    let c = h2_client();
    let broken = collect(
        &c,
        post(
            &server.url(),
            "/v1/chat/completions",
            CHAT_STREAM,
            &[(SCRIPT_HEADER, "reset=0,rst=true")],
        ),
    )
    .await;
    assert!(broken.error);
    let fine = collect(
        &c,
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    assert!(!fine.error && fine.text().ends_with("data: [DONE]\n\n"));
}

#[tokio::test(start_paused = true)]
async fn reset_mid_stream_after_n_tokens_flushes_them_first() {
    let server = MockServer::start(Script::new()).await.unwrap();
    // No gaps: the three tokens are still flushed before the connection closes.
    let (bytes, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "reset=3",
    )
    .await;
    assert_eq!(err, None);
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(text.matches("\"content\":").count(), 3, "{text}");
    assert!(!bytes.ends_with(LAST_CHUNK) && !text.contains("[DONE]"));
    assert_eq!(outcome(&server, 0).await, Outcome::ResetAfterTokens(3));
}

#[tokio::test(start_paused = true)]
async fn half_an_event_then_a_clean_end_or_a_fin() {
    let server = MockServer::start(Script::new().tokens(4)).await.unwrap();
    // Clean end of the chunked body in the middle of the third token's event.
    let c = chat(&server, "half_event=2").await;
    assert!(!c.error, "the body ends cleanly");
    let text = c.text();
    assert_eq!(text.matches("\"content\":").count(), 2, "{text}");
    let (whole, half) = text.rsplit_once("\n\n").unwrap();
    let previous = whole.rsplit_once("\n\n").unwrap().1;
    assert!(
        half.starts_with("data: {\"id\":") && !half.contains('\n'),
        "{half}"
    );
    // The third token's event is the second's with "," for " there".
    let third = format!("{}\n\n", previous.replace("\" there\"", "\",\""));
    assert_eq!(half, &third[..third.len() / 2]);
    assert_eq!(outcome(&server, 0).await, Outcome::Truncated(2));
    let (bytes, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "half_event=2",
    )
    .await;
    assert_eq!(err, None);
    assert!(bytes.ends_with(LAST_CHUNK), "terminating chunk sent");
    // The same with a FIN and no terminating chunk.
    let (bytes, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "half_event=2,reset=2",
    )
    .await;
    assert_eq!(err, None, "a clean FIN");
    assert!(!bytes.ends_with(LAST_CHUNK) && !bytes.ends_with(b"\n\n\r\n"));
    assert_eq!(outcome(&server, 2).await, Outcome::ResetAfterTokens(2));
    // After the last token: half of the finish chunk.
    let c = chat(&server, "half_event=4").await;
    assert_eq!(c.text().matches("\"content\":").count(), 4);
    assert!(!c.text().contains("\"finish_reason\":\"stop\"") && !c.error);
    // HTTP/2 ends the stream cleanly too.
    let h2 = collect(
        &h2_client(),
        post(
            &server.url(),
            "/v1/messages",
            r#"{"stream":true}"#,
            &[(SCRIPT_HEADER, "half_event=1")],
        ),
    )
    .await;
    assert!(!h2.error && h2.text().matches("event: content_block_delta").count() == 2);
    assert!(!h2.text().ends_with("\n\n"));
}

#[tokio::test(start_paused = true)]
async fn garbage_data_lines_instead_of_tokens() {
    let server = MockServer::start(Script::new().tokens(3)).await.unwrap();
    let c = chat(&server, "garbage=not_json").await;
    let events = c.data_events();
    // role, three garbage lines, finish chunk, [DONE]
    assert_eq!(events.len(), 6, "{events:?}");
    for e in &events[1..4] {
        assert!(serde_json::from_str::<serde_json::Value>(e).is_err(), "{e}");
        assert!(e.starts_with("<<garbage"));
    }
    assert_eq!(events[5], "[DONE]");
    let c = chat(&server, "garbage=bad_utf8").await;
    let bytes: Vec<u8> = c.frames.iter().flat_map(|(_, b)| b.to_vec()).collect();
    assert!(std::str::from_utf8(&bytes).is_err());
    assert_eq!(
        bytes.windows(8).filter(|w| *w == b"data: \xff\xfe").count(),
        3
    );
    assert!(bytes.ends_with(b"data: [DONE]\n\n"));
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.completed, 2);
    assert!(
        s.log
            .iter()
            .all(|r| r.tokens_sent == 0 && r.first_token.is_none())
    );
    // Ollama: bare garbage lines.
    let o = collect(
        &client(),
        post(
            &server.url(),
            "/api/generate",
            "{}",
            &[(SCRIPT_HEADER, "garbage=not_json,tokens=1")],
        ),
    )
    .await;
    assert!(
        o.text().starts_with("<<garbage 0>> {\"choices\":[\n"),
        "{}",
        o.text()
    );
}

#[tokio::test(start_paused = true)]
async fn junk_lines_before_and_after_the_first_token() {
    let server = MockServer::start(Script::new().tokens(3)).await.unwrap();
    let c = chat(&server, "junk_before=2,junk_after=1").await;
    let events = c.data_events();
    // role, two junk lines, token 1, one junk line, tokens 2 and 3, finish chunk, [DONE]
    assert_eq!(events.len(), 9, "{events:?}");
    assert_eq!(
        [&events[1], &events[2], &events[4]],
        ["this is not json at all", "{{{{", "this is not json at all"]
    );
    for i in [3, 5, 6] {
        assert!(events[i].contains("\"content\""), "{}", events[i]);
    }
    assert_eq!(events[8], "[DONE]");
    // Anthropic keeps its event name.
    let m = collect(
        &client(),
        post(
            &server.url(),
            "/v1/messages",
            tailguard_test_support::MESSAGES,
            &[(SCRIPT_HEADER, "junk_before=1,tokens=1")],
        ),
    )
    .await;
    assert!(
        m.text()
            .contains("event: content_block_delta\ndata: this is not json at all\n\n"),
        "{}",
        m.text()
    );
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.log[0].tokens_sent, 3, "junk is no token");
}

#[tokio::test(start_paused = true)]
async fn a_json_reply_to_a_streaming_request() {
    let server = MockServer::start(Script::new().tokens(2)).await.unwrap();
    let c = chat(&server, "json_reply=true").await;
    assert_eq!(c.status, 200);
    assert_eq!(c.headers["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_str(&c.text()).unwrap();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(outcome(&server, 0).await, Outcome::Completed);
}

#[tokio::test(start_paused = true)]
async fn an_endless_line_is_bounded_by_its_size() {
    let server = MockServer::start(Script::new().tokens(3)).await.unwrap();
    let c = chat(&server, "endless_line=1,line_bytes=200000").await;
    assert!(!c.error);
    let text = c.text();
    let (head, line) = text.rsplit_once("\n\n").unwrap();
    assert_eq!(head.matches("\"content\":").count(), 1);
    assert_eq!(line.len(), "data: ".len() + 200_000);
    assert!(line.starts_with("data: xxx") && !line.contains('\n'));
    assert_eq!(outcome(&server, 0).await, Outcome::Truncated(1));
    // With a reset at the same point, no terminating chunk.
    let (bytes, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "endless_line=0,line_bytes=1000,reset=0",
    )
    .await;
    assert_eq!(err, None);
    assert!(bytes.ends_with(b"xxxx\r\n") || bytes.ends_with(b"xxxx"));
}

#[tokio::test(start_paused = true)]
async fn a_body_without_its_terminal_event() {
    let server = MockServer::start(Script::new().tokens(2)).await.unwrap();
    let c = chat(&server, "no_done=true").await;
    assert!(!c.error);
    let events = c.data_events();
    assert!(
        events
            .last()
            .unwrap()
            .contains("\"finish_reason\":\"stop\"")
    );
    assert!(!c.text().contains("[DONE]"));
    let a = collect(
        &client(),
        post(
            &server.url(),
            "/v1/messages",
            r#"{"stream":true}"#,
            &[(SCRIPT_HEADER, "no_done=true")],
        ),
    )
    .await;
    assert!(a.text().contains("event: message_delta") && !a.text().contains("message_stop"));
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.truncated, 2);
    assert_eq!(s.log[0].outcome, Outcome::Truncated(2));
    let (bytes, _) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "no_done=true",
    )
    .await;
    assert!(bytes.ends_with(LAST_CHUNK), "a clean end");
}

#[tokio::test(start_paused = true)]
async fn head_after_slot_sends_no_headers_while_queued() {
    let options = ReplicaOptions::new().head_after_slot(true);
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = MockServer::start_with(addr, Script::new().ttft(MS(300)).tokens(2), options)
        .await
        .unwrap();
    let url = server.url();
    let start = Instant::now();
    let first = tokio::spawn({
        let url = url.clone();
        async move { chat_at(&url).await }
    });
    tokio::time::sleep(MS(10)).await;
    let second = chat_at(&url).await;
    first.await.unwrap();
    // The second request's head came only when the first one freed the slot.
    assert_eq!(second.frames[0].0 - start, MS(300));
    assert_eq!(second.time_of("\"content\"").unwrap() + MS(10), MS(600));
    let s = server.stats();
    assert_eq!(s.log[0].time_to_headers(), Some(MS(0)));
    assert_eq!(s.log[1].time_to_headers(), Some(MS(290)));
}

#[tokio::test(start_paused = true)]
async fn a_newer_request_interrupts_the_running_stream_llama_cpp_style() {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = MockServer::start_with(
        addr,
        Script::new().ttft(MS(100)).tokens(5).gap(MS(100)),
        ReplicaOptions::llama_cpp_python(),
    )
    .await
    .unwrap();
    let start = Instant::now();
    let older = tokio::spawn(raw(server.addr(), "/v1/chat/completions", CHAT_STREAM, ""));
    tokio::time::sleep(MS(10)).await;
    // A newer request before the first token: the older stream gets the role chunk, a bare
    // [DONE] and a close without the terminating chunk (the captured llama-cpp-python stream).
    let newer = collect(
        &client(),
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    let (bytes, err) = older.await.unwrap();
    assert_eq!(err, None);
    let text = String::from_utf8_lossy(&bytes);
    let body = text.split_once("\r\n\r\n").unwrap().1;
    assert!(body.contains("\"role\":\"assistant\""), "{body}");
    assert!(!body.contains("\"content\""), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n\r\n"), "{body:?}");
    // The newer one got the slot (and its head) once the older had let it go.
    assert_eq!(newer.frames[0].0 - start, MS(100));
    assert_eq!(newer.data_events().len(), 8);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.interrupted, 1);
    assert_eq!(s.log[0].outcome, Outcome::Interrupted(0));
    assert_eq!(s.log[1].outcome, Outcome::Completed);
}

#[tokio::test(start_paused = true)]
async fn interrupt_mid_stream_at_the_next_token() {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let options = ReplicaOptions::new().interrupt(true);
    let server = MockServer::start_with(addr, Script::new().tokens(5).gap(MS(100)), options)
        .await
        .unwrap();
    let url = server.url();
    let older = tokio::spawn(async move { chat_at(&url).await });
    tokio::time::sleep(MS(250)).await;
    let newer = chat_at(&server.url()).await;
    let older = older.await.unwrap();
    assert!(older.error, "HTTP/1.1 closed without the terminating chunk");
    assert_eq!(
        older
            .data_events()
            .iter()
            .filter(|e| e.contains("content"))
            .count(),
        3
    );
    assert_eq!(older.data_events().last().unwrap(), "[DONE]");
    assert!(!newer.error);
    server.wait_idle().await;
    assert_eq!(server.stats().log[0].outcome, Outcome::Interrupted(3));
}

/// `interrupt_after=N`: the interrupt of a newer request, on command: N tokens, a bare
/// `[DONE]` with no finish reason before it, and a close without the terminating chunk.
#[tokio::test(start_paused = true)]
async fn interrupt_after_n_tokens_on_command() {
    let server = MockServer::start(Script::new().tokens(6).gap(MS(10)))
        .await
        .unwrap();
    let c = chat(&server, "interrupt_after=2").await;
    assert!(c.error, "HTTP/1.1 closed without the terminating chunk");
    let events = c.data_events();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.contains("\"content\":\""))
            .count(),
        2,
        "{events:?}"
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(
        !c.text().contains("\"finish_reason\":\""),
        "no finish reason"
    );
    assert_eq!(outcome(&server, 0).await, Outcome::Interrupted(2));
    // On the wire: the bare [DONE] is the last thing before the FIN.
    let (bytes, err) = raw(
        server.addr(),
        "/v1/chat/completions",
        CHAT_STREAM,
        "interrupt_after=2",
    )
    .await;
    assert_eq!(err, None);
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.ends_with("data: [DONE]\n\n\r\n"), "{text:?}");
    // A request without the key completes.
    let c = chat(&server, "").await;
    assert!(!c.error && c.text().contains("\"finish_reason\":\"stop\""));
    server.wait_idle().await;
    assert_eq!(server.stats().interrupted, 2);
}

async fn chat_at(url: &str) -> Collected {
    collect(
        &client(),
        post(url, "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn idle_keep_alive_connections_close_as_uvicorn_does() {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let options =
        ReplicaOptions::new().keep_alive_timeout(Some(tailguard_mock::UVICORN_KEEP_ALIVE));
    let server = MockServer::start_with(addr, Script::new(), options)
        .await
        .unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    // Two requests on one connection, the second 4 s after the first: still open.
    for _ in 0..2 {
        s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: mock\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let idle_since = Instant::now() - Duration::from_secs(4);
    let (rest, err) = read_to_end(&mut s).await;
    assert_eq!(
        (rest.len(), err),
        (0, None),
        "closed with a FIN, nothing sent"
    );
    assert_eq!(idle_since.elapsed(), Duration::from_secs(5));
    // Without the option, connections stay open.
    let server = MockServer::start(Script::new()).await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(60), s.read(&mut [0u8; 16])).await;
    assert!(r.is_err(), "still open after a minute");
}

#[tokio::test(start_paused = true)]
async fn a_request_cancelled_while_queued_still_costs_its_prefill() {
    for prefill_cancelled in [false, true] {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let options = ReplicaOptions::new().prefill_cancelled(prefill_cancelled);
        let script = Script::new().single_slot(true).ttft(MS(100)).tokens(1);
        let server = MockServer::start_with(addr, script, options).await.unwrap();
        let c = client();
        let start = Instant::now();
        let req = |s: &'static str| {
            post(
                &server.url(),
                "/v1/chat/completions",
                CHAT_STREAM,
                &[(SCRIPT_HEADER, s)],
            )
        };
        let first = send(&c, req("")).await;
        let queued = send(&c, req("ttft=500ms")).await;
        drop(queued);
        let third = send(&c, req("")).await;
        let (a, b) = tokio::join!(
            collect_response(first, start),
            collect_response(third, start)
        );
        assert_eq!(a.time_of("\"content\"").unwrap(), MS(100));
        server.wait_idle().await;
        let s = server.stats();
        assert_eq!(s.cancelled, 1);
        if prefill_cancelled {
            // The cancelled request held the slot from 100 ms for its 500 ms prefill.
            assert_eq!(b.time_of("\"content\"").unwrap(), MS(700));
            assert_eq!(s.served_late, 1);
            assert!(s.log[1].served_late);
            assert_eq!(s.log[1].outcome, Outcome::Cancelled);
            assert_eq!(start.elapsed(), MS(700));
        } else {
            assert_eq!(b.time_of("\"content\"").unwrap(), MS(200));
            assert_eq!(s.served_late, 0);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn once_streaming_a_cancel_stops_generation_at_once() {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let options = ReplicaOptions::new().prefill_cancelled(true);
    let script = Script::new()
        .single_slot(true)
        .tokens(5)
        .gap(Duration::from_secs(1));
    let server = MockServer::start_with(addr, script, options).await.unwrap();
    let res = send(
        &client(),
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap(); // role
    body.frame().await.unwrap().unwrap(); // token 0
    let dropped = Instant::now();
    drop(body);
    server.wait_idle().await;
    assert!(dropped.elapsed() < Duration::from_secs(1));
    let s = server.stats();
    assert_eq!((s.cancelled, s.served_late), (1, 0));
    assert_eq!(s.log[0].tokens_sent, 1);
}
