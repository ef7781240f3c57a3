//! Reading a body to its end: [`collect`] and its views.

use std::time::Duration;

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::BoxError;
use crate::wire::at_event_boundary;

/// What a client read from a body, with the (paused-clock) time since `start` of each item.
#[derive(Debug, Default)]
pub struct Collected {
    /// Every data frame, with when it arrived.
    pub data: Vec<(Duration, Bytes)>,
    /// The trailers, if any came.
    pub trailers: Option<HeaderMap>,
    /// The body error that ended the body, with when it came.
    pub error: Option<(Duration, BoxError)>,
    /// When the body ended (its end, or its error).
    pub ended_at: Duration,
}

impl Collected {
    /// The data frames as they came.
    pub fn frames(&self) -> Vec<Bytes> {
        self.data.iter().map(|(_, b)| b.clone()).collect()
    }

    /// Every data byte, in order.
    pub fn bytes(&self) -> Vec<u8> {
        self.data.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }

    /// The data as UTF-8 text; panics if it is not.
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

    /// Panics unless, at every instant at which frames arrived, the bytes delivered so far end
    /// where an SSE parser holds no partial event: the client never waits holding half an event.
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
}

/// Reads `body` to its end (or its first error), recording when each item arrived.
pub async fn collect<B>(body: B, start: Instant) -> Collected
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut seen = Collected::default();
    while let Some(frame) = body.frame().await {
        let at = start.elapsed();
        match frame {
            Ok(frame) => match frame.into_data() {
                Ok(mut d) => seen.data.push((at, d.copy_to_bytes(d.remaining()))),
                Err(frame) => seen.trailers = frame.into_trailers().ok(),
            },
            Err(e) => {
                seen.error = Some((at, e.into()));
                break;
            }
        }
    }
    seen.ended_at = start.elapsed();
    seen
}

/// Reads `body` to its end: (data frames, trailers, whether it ended in an error).
pub async fn frames<B>(body: B) -> (Vec<Bytes>, Option<HeaderMap>, bool)
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let seen = collect(body, Instant::now()).await;
    (seen.frames(), seen.trailers, seen.error.is_some())
}

/// Reads `body` to its end: (every data byte, whether it ended in an error).
pub async fn read_all<B>(body: B) -> (Vec<u8>, bool)
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let seen = collect(body, Instant::now()).await;
    (seen.bytes(), seen.error.is_some())
}

/// Reads `body` to its end: its bytes, or its error.
pub async fn drain<B: Body>(body: B) -> Result<Bytes, B::Error> {
    Ok(body.collect().await?.to_bytes())
}

/// The bytes of `frames`, concatenated.
pub fn concat(frames: &[Bytes]) -> Vec<u8> {
    frames.concat()
}
