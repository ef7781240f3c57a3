//! The batching replica: K slots, prefill by prompt size, decode gaps that grow with the batch,
//! and K changed mid-run.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tailguard_mock::{MockServer, ReplicaOptions, Script};
use tokio::time::{Instant, sleep};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Two prompt tokens ("hello world").
const BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello world"}]}"#;

async fn batching(slots: u32) -> MockServer {
    let script = Script::new()
        .ttft(MS(100))
        .prefill_per_token(MS(10))
        .tokens(3)
        .gap(MS(40));
    let options = ReplicaOptions::new().batching(slots);
    MockServer::start_with(SocketAddr::from(([127, 0, 0, 1], 0)), script, options)
        .await
        .unwrap()
}

fn first_token(c: &Collected) -> Duration {
    c.frames
        .iter()
        .find(|(_, b)| std::str::from_utf8(b).unwrap().contains("\"content\":\""))
        .map(|(t, _)| *t - c.start)
        .expect("a token")
}

/// Starts `n` requests at `start + i × stagger`; returns their first-token times from `start`.
async fn first_tokens(server: &MockServer, n: usize, start: Instant) -> Vec<Duration> {
    let c = client();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let c = c.clone();
            let url = server.url();
            tokio::spawn(async move {
                sleep(MS(i as u64)).await;
                let res = send(&c, post(&url, "/v1/chat/completions", BODY, &[])).await;
                first_token(&collect_response(res, start).await)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn requests_beyond_the_slots_wait_for_one_then_prefill() {
    let server = batching(2).await;
    let start = Instant::now();
    let firsts = first_tokens(&server, 3, start).await;
    // TTFT 100 ms + 2 prompt tokens × 10 ms. Both slots busy: each gap is 40 × 1.25 = 50 ms, so
    // a slot is held 120 + 2 × 50 = 220 ms; the third request gets the first one freed and
    // prefills for 120 ms.
    assert_eq!(firsts, vec![MS(120), MS(121), MS(220 + 120)]);
    let s = server.stats();
    assert_eq!(s.completed, 3);
    assert_eq!(s.peak_concurrent, 3);
}

#[tokio::test(start_paused = true)]
async fn shrinking_mid_run_takes_busy_slots_as_they_free() {
    let server = batching(2).await;
    assert_eq!(server.slots(), 2);
    let start = Instant::now();
    let shrink = async {
        sleep(MS(10)).await;
        server.set_slots(1);
    };
    let (firsts, ()) = tokio::join!(first_tokens(&server, 4, start), shrink);
    assert_eq!(server.slots(), 1);
    // The first two run together and free their slots at 220 and 221 ms. The first one freed
    // is taken away; the third gets the second and runs alone (gaps 40 × 1.25 = 50 ms, slot
    // held 220 ms); the fourth waits for it.
    assert_eq!(firsts[..2], [MS(120), MS(121)]);
    assert_eq!(firsts[2], MS(221 + 120));
    assert_eq!(firsts[3], MS(221 + 220 + 120));
}

#[tokio::test(start_paused = true)]
async fn growing_mid_run_admits_waiters_at_once() {
    let server = batching(1).await;
    let start = Instant::now();
    let grow = async {
        sleep(MS(50)).await;
        server.set_slots(3);
    };
    let (firsts, ()) = tokio::join!(first_tokens(&server, 3, start), grow);
    // The two waiters take the new slots at 50 ms and prefill for 120 ms.
    assert_eq!(firsts, vec![MS(120), MS(170), MS(170)]);
}

#[test]
fn batching_shows_in_the_options() {
    let o = ReplicaOptions::new().batching(16);
    assert!(o.to_string().ends_with(",batching=16"), "{o}");
}
