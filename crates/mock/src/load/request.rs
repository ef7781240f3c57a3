//! One request of a run: sends it, reads its response body (SSE, NDJSON or plain) and times
//! it into a [`Sample`], every latency from the request's scheduled send time.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;

use super::EndReason;
use super::report::Sample;
use crate::sse::{EventKind, NdjsonReader, SseReader};

/// The client every request of a run goes through.
pub(super) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Sends `req`, scheduled at `scheduled`, and reads its response to the end.
pub(super) async fn one_request(
    client: HttpClient,
    req: Request<Full<Bytes>>,
    scheduled: Instant,
) -> Sample {
    let res = match client.request(req).await {
        Ok(r) => r,
        Err(_) => {
            return Sample {
                end: Some(EndReason::Transport),
                total: Some(scheduled.elapsed()),
                ..Sample::default()
            };
        }
    };
    let mut reading = Reading::new(scheduled, res.status(), Framing::of(res.headers()));
    let mut body = res.into_body();
    let mut transport = false;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(_) => {
                transport = true;
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        reading.data(&data, Instant::now());
    }
    reading.finish(transport)
}

/// How a response body is framed, from its content type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `text/event-stream`.
    Sse,
    /// `application/x-ndjson` or `application/jsonl`.
    Ndjson,
    /// Anything else: not a stream.
    Plain,
}

impl Framing {
    fn of(headers: &HeaderMap) -> Self {
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if content_type.starts_with("text/event-stream") {
            Framing::Sse
        } else if content_type.starts_with("application/x-ndjson")
            || content_type.starts_with("application/jsonl")
        {
            Framing::Ndjson
        } else {
            Framing::Plain
        }
    }

    fn streamed(self) -> bool {
        self != Framing::Plain
    }
}

/// What the events of a response have told so far.
struct Events {
    sample: Sample,
    scheduled: Instant,
    last_token: Option<Instant>,
    done: bool,
    error: bool,
}

impl Events {
    /// An event that arrived at `now`.
    fn on_event(&mut self, kind: EventKind, now: Instant) {
        match kind {
            EventKind::Token => {
                self.sample.tokens += 1;
                match self.last_token {
                    None => self.sample.ttft = Some(now - self.scheduled),
                    Some(prev) => self.sample.gaps.push(now - prev),
                }
                self.last_token = Some(now);
            }
            EventKind::Done => self.done = true,
            EventKind::Error => self.error = true,
            EventKind::Meta | EventKind::Keepalive => {}
        }
    }

    /// An event of the unterminated last NDJSON line, at the end of the body.
    fn on_trailing(&mut self, kind: EventKind) {
        match kind {
            EventKind::Done => self.done = true,
            EventKind::Error => self.error = true,
            // A trailing token line without a line end: counted, no gap (its arrival time is
            // the last frame's, already past).
            EventKind::Token => self.sample.tokens += 1,
            EventKind::Meta | EventKind::Keepalive => {}
        }
    }
}

/// The reading of one response body.
struct Reading {
    status: StatusCode,
    framing: Framing,
    sse: SseReader,
    lines: NdjsonReader,
    events: Events,
}

impl Reading {
    /// Headers with `status` arrived now, for a request scheduled at `scheduled`.
    fn new(scheduled: Instant, status: StatusCode, framing: Framing) -> Self {
        let sample = Sample {
            headers: Some(scheduled.elapsed()),
            status: Some(status.as_u16()),
            ..Sample::default()
        };
        Reading {
            status,
            framing,
            sse: SseReader::new(),
            lines: NdjsonReader::new(),
            events: Events {
                sample,
                scheduled,
                last_token: None,
                done: false,
                error: false,
            },
        }
    }

    /// A data frame that arrived at `now`.
    fn data(&mut self, data: &[u8], now: Instant) {
        let events = &mut self.events;
        match self.framing {
            Framing::Plain => {
                if !data.is_empty() && events.sample.ttft.is_none() && self.status.is_success() {
                    events.sample.ttft = Some(now - events.scheduled);
                }
            }
            Framing::Sse => self.sse.feed(data, |kind| events.on_event(kind, now)),
            Framing::Ndjson => self.lines.feed(data, |kind| events.on_event(kind, now)),
        }
    }

    /// The body ended (`transport`: with an error): the request's sample.
    fn finish(mut self, transport: bool) -> Sample {
        let events = &mut self.events;
        if self.framing == Framing::Ndjson && !transport {
            self.lines.finish(|kind| events.on_trailing(kind));
        }
        let Events {
            mut sample,
            scheduled,
            done,
            error,
            ..
        } = self.events;
        sample.total = Some(scheduled.elapsed());
        sample.end = Some(if transport {
            EndReason::Transport
        } else if !self.status.is_success() {
            EndReason::HttpStatus
        } else if error {
            EndReason::ErrorEvent
        } else if done || !self.framing.streamed() {
            EndReason::Completed
        } else {
            EndReason::Truncated
        });
        sample
    }
}
