//! The client side: the seeded schedule (arrival times, route, output limit, fault and break
//! point of every request), and one request sent at its scheduled time and read to its end.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::Value;
use tailguard_mock::SplitMix64;
use tokio::time::{Instant, sleep_until, timeout};

/// Tokens of the mock's whole answer (the replicas' script).
pub(crate) const TOKENS: u32 = 60;
/// Share of the requests that carry a fault for their first attempt.
pub(crate) const BROKEN_SHARE: f64 = 0.10;
/// Share of the requests sent to `/v1/completions` (the rest: chat completions).
pub(crate) const COMPLETIONS_SHARE: f64 = 0.2;
/// Share of the requests with `max_tokens` ([`CAPPED_TOKENS`]: the answer ends with
/// `finish_reason: "length"`, and a continuation's limit is lowered by what was sent).
pub(crate) const CAPPED_SHARE: f64 = 0.25;
pub(crate) const CAPPED_TOKENS: u32 = 45;
/// The client gives up on a request after this long.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The header that names a request in the replicas' logs.
pub(crate) const BENCH_ID: &str = "x-bench-id";

/// How the first attempt of a broken request breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Fault {
    /// The connection closes mid-body (a FIN without the terminating chunk).
    Reset,
    /// The stream goes silent, no keepalives, for good.
    Stall,
    /// Half an event, then a clean end of the body: no finish reason, no `[DONE]`.
    Truncation,
    /// A bare `data: [DONE]` with no finish reason, then a close (llama.cpp's interrupt).
    Interruption,
}

impl Fault {
    pub(crate) const ALL: [Fault; 4] = [
        Fault::Reset,
        Fault::Stall,
        Fault::Truncation,
        Fault::Interruption,
    ];

    /// The fault named `name` (as [`name`](Self::name) spells it).
    pub(crate) fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Reset => "reset",
            Fault::Stall => "stall",
            Fault::Truncation => "truncation",
            Fault::Interruption => "interruption",
        }
    }

    /// The mock script that breaks a stream this way after `k` tokens.
    pub(crate) fn script(self, k: u32) -> String {
        match self {
            Fault::Reset => format!("reset_after={k}"),
            Fault::Stall => format!("stall_after={k}"),
            Fault::Truncation => format!("half_event={k}"),
            Fault::Interruption => format!("interrupt_after={k}"),
        }
    }
}

/// One request of the schedule.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) index: usize,
    /// Scheduled send time, from the start of the run.
    pub(crate) at: Duration,
    pub(crate) completions: bool,
    pub(crate) max_tokens: Option<u32>,
    /// In the broken runs: how the first attempt breaks, and after how many tokens.
    pub(crate) fault: Option<(Fault, u32)>,
}

impl Spec {
    /// Tokens of the uninterrupted answer.
    pub(crate) fn tokens(&self) -> u32 {
        self.max_tokens.map_or(TOKENS, |m| m.min(TOKENS))
    }

    pub(crate) fn path(&self) -> &'static str {
        match self.completions {
            true => "/v1/completions",
            false => "/v1/chat/completions",
        }
    }

    /// The JSON body: streamed, with usage; each request's own prompt.
    pub(crate) fn body(&self) -> String {
        let prompt = format!("Request {}: tell me about the weather.", self.index);
        let input = match self.completions {
            true => format!(r#""prompt":"{prompt}""#),
            false => format!(r#""messages":[{{"role":"user","content":"{prompt}"}}]"#),
        };
        let limit = self
            .max_tokens
            .map(|m| format!(r#","max_tokens":{m}"#))
            .unwrap_or_default();
        format!(
            r#"{{"model":"mock-llm","stream":true,"stream_options":{{"include_usage":true}},{input}{limit}}}"#
        )
    }
}

/// `n` requests at `rate` (Poisson arrivals, seeded), [`BROKEN_SHARE`] of them (a seeded
/// choice) broken, the `kinds` of [`Fault`] in turn over a shuffled order, each at a random
/// token of the middle third of its answer.
pub(crate) fn schedule(n: usize, rate: f64, seed: u64, kinds: &[Fault]) -> Vec<Spec> {
    let mut rng = SplitMix64::new(seed);
    let mut t = 0.0;
    let mut specs: Vec<Spec> = (0..n)
        .map(|index| {
            t += rng.next_exp() / rate;
            Spec {
                index,
                at: Duration::from_secs_f64(t),
                completions: rng.next_f64() < COMPLETIONS_SHARE,
                max_tokens: (rng.next_f64() < CAPPED_SHARE).then_some(CAPPED_TOKENS),
                fault: None,
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let broken = if kinds.is_empty() {
        0
    } else {
        (n as f64 * BROKEN_SHARE).round() as usize
    };
    for (j, &i) in order[..broken].iter().enumerate() {
        let n = specs[i].tokens();
        let (lo, hi) = (n / 3, 2 * n / 3);
        let k = lo + (rng.next_u64() % u64::from(hi - lo + 1)) as u32;
        specs[i].fault = Some((kinds[j % kinds.len()], k));
    }
    specs
}

/// What one request got.
#[derive(Clone, Debug, Default)]
pub(crate) struct Record {
    pub(crate) status: u16,
    /// The deltas (chat) or texts (completions), concatenated.
    pub(crate) text: String,
    pub(crate) finish: Option<String>,
    pub(crate) completion_tokens: Option<u64>,
    pub(crate) done: bool,
    pub(crate) error_event: bool,
    pub(crate) transport: bool,
    pub(crate) timed_out: bool,
    /// Scheduled send time to the first content, and to the end of the body.
    pub(crate) ttft: Option<Duration>,
    pub(crate) total: Duration,
    /// Longest gap between two content events.
    pub(crate) max_gap: Duration,
}

impl Record {
    /// How the request ended, from the client's side.
    pub(crate) fn end(&self) -> &'static str {
        if self.timed_out {
            "timeout"
        } else if self.status != 200 {
            "http_status"
        } else if self.error_event {
            "error_event"
        } else if self.done && self.finish.is_none() {
            "done_without_finish"
        } else if self.transport {
            "transport"
        } else if !self.done {
            "truncated"
        } else {
            "completed"
        }
    }

    /// A finish reason and `[DONE]`, no in-band error, no transport error.
    pub(crate) fn completed(&self) -> bool {
        self.end() == "completed"
    }
}

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A pooled HTTP/1.1 client with `TCP_NODELAY`.
pub(crate) fn client() -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(c)
}

/// Sends `spec` to `base` at `start + spec.at` (with its fault when `faults`) and reads the
/// response to its end; every time is measured from the scheduled send time.
pub(crate) async fn send(
    client: HttpClient,
    base: String,
    spec: Spec,
    faults: bool,
    start: Instant,
) -> Record {
    let scheduled = start + spec.at;
    sleep_until(scheduled).await;
    let mut req = Request::post(format!("{base}{}", spec.path()))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(BENCH_ID, spec.index);
    if let (true, Some((fault, k))) = (faults, spec.fault) {
        req = req.header("x-mock-script-0", fault.script(k));
    }
    let req = match req.body(Full::new(Bytes::from(spec.body()))) {
        Ok(r) => r,
        Err(_) => return Record::default(),
    };
    let mut record = Record::default();
    let read = read(&client, req, scheduled, &mut record);
    if timeout(REQUEST_TIMEOUT, read).await.is_err() {
        record.timed_out = true;
    }
    record.total = scheduled.elapsed();
    record
}

async fn read(
    client: &HttpClient,
    req: Request<Full<Bytes>>,
    scheduled: Instant,
    record: &mut Record,
) {
    let res = match client.request(req).await {
        Ok(r) => r,
        Err(_) => {
            record.transport = true;
            return;
        }
    };
    record.status = res.status().as_u16();
    let mut body = res.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut last: Option<Instant> = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            record.transport = true;
            return;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            if event_content(&event, record) {
                let now = Instant::now();
                match last {
                    None => record.ttft = Some(now - scheduled),
                    Some(prev) => record.max_gap = record.max_gap.max(now - prev),
                }
                last = Some(now);
            }
        }
    }
}

/// Reads one SSE event into `record`; `true` if it carried content.
fn event_content(event: &[u8], record: &mut Record) -> bool {
    let text = String::from_utf8_lossy(event);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return false;
    }
    let data = data.join("\n");
    if data == "[DONE]" {
        record.done = true;
        return false;
    }
    let Ok(v) = serde_json::from_str::<Value>(&data) else {
        record.error_event = true;
        return false;
    };
    if !v["error"].is_null() {
        record.error_event = true;
        return false;
    }
    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
        record.completion_tokens = Some(n);
    }
    let choice = &v["choices"][0];
    if let Some(f) = choice["finish_reason"].as_str() {
        record.finish = Some(f.to_owned());
    }
    let piece = choice["delta"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .unwrap_or("");
    record.text.push_str(piece);
    !piece.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenth_is_broken_each_kind_evenly_in_the_middle_third() {
        let specs = schedule(400, 20.0, 7, &Fault::ALL);
        let broken: Vec<(Fault, u32, u32)> = specs
            .iter()
            .filter_map(|s| s.fault.map(|(f, k)| (f, k, s.tokens())))
            .collect();
        assert_eq!(broken.len(), 40);
        for f in Fault::ALL {
            assert_eq!(broken.iter().filter(|b| b.0 == f).count(), 10);
        }
        assert!(broken.iter().all(|&(_, k, n)| k >= n / 3 && k <= 2 * n / 3));
        // The same seed, the same schedule.
        let again = schedule(400, 20.0, 7, &Fault::ALL);
        assert!(
            specs
                .iter()
                .zip(&again)
                .all(|(a, b)| a.at == b.at && a.fault == b.fault)
        );
        assert!(specs.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn reads_text_finish_usage_and_done() {
        let mut r = Record::default();
        let chat =
            br#"data: {"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}"#;
        assert!(event_content(&[&chat[..], b"\n\n"].concat(), &mut r));
        let fin = br#"data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}"#;
        assert!(!event_content(&[&fin[..], b"\n\n"].concat(), &mut r));
        let usage = br#"data: {"choices":[],"usage":{"completion_tokens":60}}"#;
        assert!(!event_content(&[&usage[..], b"\n\n"].concat(), &mut r));
        assert!(!event_content(b": keepalive\n\n", &mut r));
        assert!(!r.completed());
        assert!(!event_content(b"data: [DONE]\n\n", &mut r));
        r.status = 200;
        assert!(r.completed());
        assert_eq!((r.text.as_str(), r.completion_tokens), ("Hello", Some(60)));
        r.finish = None;
        assert_eq!(r.end(), "done_without_finish");
    }
}
