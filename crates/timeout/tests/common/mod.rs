//! Hand-made scripted bodies driven by the (paused) tokio clock, in the task that polls them.
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame};
use tokio::time::{Instant, Sleep};

/// One step of a scripted body.
#[derive(Clone, Debug)]
pub enum Step {
    Wait(Duration),
    Data(Bytes),
    Trailers(HeaderMap),
    Fail,
}

pub fn wait_ms(ms: u64) -> Step {
    Step::Wait(Duration::from_millis(ms))
}

pub fn data(s: &str) -> Step {
    Step::Data(Bytes::copy_from_slice(s.as_bytes()))
}

pub fn token(text: &str) -> Step {
    data(&format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    ))
}

pub fn role() -> Step {
    data("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n")
}

pub fn keepalive() -> Step {
    data(": keepalive\n\n")
}

pub fn done() -> Step {
    data("data: [DONE]\n\n")
}

/// Flags shared with the test: whether the body was dropped before it ended.
#[derive(Clone, Debug, Default)]
pub struct Probe {
    pub ended: Arc<AtomicBool>,
    pub dropped: Arc<AtomicBool>,
}

impl Probe {
    /// Dropped before the script ended: the upstream saw a cancellation.
    pub fn cancelled(&self) -> bool {
        self.dropped.load(Ordering::SeqCst) && !self.ended.load(Ordering::SeqCst)
    }
}

pin_project_lite::pin_project! {
    /// A body that plays a script on a schedule that starts when it is first polled: each
    /// `Wait` moves the time the next frame is due, and a frame whose time has come is ready at
    /// once (an upstream that keeps producing while the client is not reading). Waits are tokio
    /// sleeps in the polling task, so with a paused clock a frame due at the same instant as a
    /// timer is ready when the body is polled.
    pub struct ScriptBody {
        steps: VecDeque<Step>,
        due: Option<Instant>,
        #[pin]
        sleep: Option<Sleep>,
        probe: Probe,
        hint: Option<u64>,
    }
    impl PinnedDrop for ScriptBody {
        fn drop(this: Pin<&mut Self>) {
            this.probe.dropped.store(true, Ordering::SeqCst);
        }
    }
}

impl ScriptBody {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> (Self, Probe) {
        let probe = Probe::default();
        (
            ScriptBody {
                steps: steps.into_iter().collect(),
                due: None,
                sleep: None,
                probe: probe.clone(),
                hint: None,
            },
            probe,
        )
    }

    pub fn with_exact_hint(mut self, n: u64) -> Self {
        self.hint = Some(n);
        self
    }
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let mut this = self.project();
        let due = this.due.get_or_insert_with(Instant::now);
        loop {
            if let Some(s) = this.sleep.as_mut().as_pin_mut() {
                std::task::ready!(std::future::Future::poll(s, cx));
                this.sleep.set(None);
            }
            match this.steps.pop_front() {
                None => {
                    this.probe.ended.store(true, Ordering::SeqCst);
                    return Poll::Ready(None);
                }
                Some(Step::Wait(d)) => {
                    *due += d;
                    this.sleep.set(Some(tokio::time::sleep_until(*due)));
                }
                Some(Step::Data(b)) => {
                    if let Some(h) = this.hint.as_mut() {
                        *h = h.saturating_sub(b.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Some(Step::Trailers(t)) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Some(Step::Fail) => {
                    return Poll::Ready(Some(Err(std::io::Error::other("upstream reset"))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.steps.is_empty() && self.sleep.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.hint {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        }
    }
}

/// What the client saw, with the (paused-clock) time since `start` of each item.
#[derive(Debug, Default)]
pub struct Seen {
    pub data: Vec<(Duration, Bytes)>,
    pub trailers: Option<HeaderMap>,
    pub error: Option<(Duration, tailguard_core::BoxError)>,
    pub ended_at: Duration,
}

impl Seen {
    pub fn bytes(&self) -> Vec<u8> {
        self.data.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }

    /// Panics unless, at every instant at which frames arrived, the bytes delivered so far end
    /// where an SSE parser holds no partial event: at a blank line, or after a comment line
    /// outside an event. The client never waits holding half an event.
    pub fn assert_whole_events_at_every_instant(&self) {
        let mut sofar = Vec::new();
        for (i, (at, b)) in self.data.iter().enumerate() {
            sofar.extend_from_slice(b);
            let last_at_this_instant = self.data.get(i + 1).is_none_or(|(next, _)| next != at);
            if last_at_this_instant {
                assert!(
                    at_event_boundary(&sofar),
                    "at {at:?} the client holds half an event: {:?}",
                    String::from_utf8_lossy(&sofar)
                );
            }
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.bytes()).expect("utf-8")
    }

    /// The SSE events (split on blank lines); panics if the stream ends mid-event.
    pub fn events(&self) -> Vec<String> {
        let text = self.text();
        assert!(
            text.is_empty() || text.ends_with("\n\n"),
            "stream ends mid-event: {text:?}"
        );
        text.split_terminator("\n\n").map(str::to_owned).collect()
    }
}

/// Reads a body to its end, recording when each frame arrived.
pub async fn collect<B>(body: B, start: Instant) -> Seen
where
    B: Body,
    B::Error: Into<tailguard_core::BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut seen = Seen::default();
    loop {
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let at = start.elapsed();
        match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut d) => {
                    let b = d.copy_to_bytes(d.remaining());
                    seen.data.push((at, b));
                }
                Err(frame) => seen.trailers = frame.into_trailers().ok(),
            },
            Some(Err(e)) => {
                seen.error = Some((at, e.into()));
                break;
            }
        }
    }
    seen.ended_at = start.elapsed();
    seen
}

/// The JSON of an OpenAI error event `data: {"error":..}`.
pub fn error_json(event: &str) -> serde_json::Value {
    let json = event.strip_prefix("data: ").expect("data event");
    let v: serde_json::Value = serde_json::from_str(json).expect("valid json");
    assert!(v.get("error").is_some(), "not an error event: {event}");
    v
}

/// Whether an SSE parser fed `bytes` (LF line ends) holds no partial event.
pub fn at_event_boundary(bytes: &[u8]) -> bool {
    if !(bytes.is_empty() || bytes.ends_with(b"\n")) {
        return false;
    }
    let mut in_event = false;
    for line in bytes.split(|b| *b == b'\n') {
        if line.is_empty() {
            in_event = false;
        } else if !line.starts_with(b":") {
            in_event = true;
        }
    }
    !in_event
}
