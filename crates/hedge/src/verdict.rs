//! What an attempt's response says before its first token: plain decisions on its head, its
//! frames and its end, with no polling and no state of their own.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, StatusCode};
use tailguard_core::headers::grpc_status;
use tailguard_core::{Dialect, GrpcCode, Observation, UpstreamFailure};

use crate::config::Config;

/// How informative a failed attempt is. When every attempt fails, the client gets the highest
/// ranked failure (see [`Fault::replaces`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// The inner service failed: no response at all.
    NoResponse,
    /// A `2xx` stream that ended, or broke, before its first token (answered with a rendered
    /// `502`, see [`Fault::replayed`]).
    NoToken,
    /// A retryable HTTP status, with its headers and body.
    Status,
    /// An in-band error event or a retryable gRPC status: the upstream's own words.
    InBand,
}

/// Why an attempt failed before its first token, and how informative that failure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) kind: UpstreamFailure,
    pub(crate) rank: Rank,
    /// What the attempt did, for messages ("its stream completed without a token").
    pub(crate) what: &'static str,
    /// The `code` of the rendered `502` (see [`Fault::replayed`]).
    pub(crate) code: &'static str,
}

impl Fault {
    /// The inner service returned an error instead of a response.
    pub(crate) const NO_RESPONSE: Fault = Fault::new(
        UpstreamFailure::Transport,
        Rank::NoResponse,
        "it got no response",
        "upstream_stream_broken",
    );
    /// The response body failed before its first token.
    pub(crate) const BODY_ERROR: Fault = Fault::new(
        UpstreamFailure::Transport,
        Rank::NoToken,
        "its stream broke before its first token",
        "upstream_stream_broken",
    );
    /// The stream completed (its terminal event, or gRPC trailers with `OK`) without a token.
    pub(crate) const NO_TOKEN: Fault = Fault::new(
        UpstreamFailure::Protocol,
        Rank::NoToken,
        "its stream completed without a token",
        "upstream_no_token",
    );
    /// The stream sent junk before its first token: an event its dialect cannot carry (for
    /// OpenAI and Anthropic SSE, data that is not a JSON object), which a client cannot decode.
    pub(crate) const MALFORMED: Fault = Fault::new(
        UpstreamFailure::Protocol,
        Rank::NoToken,
        "its stream sent data that is not a JSON object before its first token",
        "upstream_malformed",
    );
    /// A `2xx` answer that is not a stream (a whole JSON completion, an error document) to a
    /// request that asked to stream: the client's stream would read nothing.
    pub(crate) const NOT_A_STREAM: Fault = Fault::new(
        UpstreamFailure::Protocol,
        Rank::NoToken,
        "it answered the streaming request with a reply that is not a stream",
        "upstream_not_a_stream",
    );
    /// The body ended before its first token and before its terminal event (half an event, a
    /// stream cut short).
    pub(crate) const TRUNCATED: Fault = Fault::new(
        UpstreamFailure::Truncated,
        Rank::NoToken,
        "its stream ended before its first token",
        "upstream_truncated",
    );
    /// An in-band error event, or a retryable gRPC status.
    pub(crate) const IN_BAND: Fault = Fault::new(
        UpstreamFailure::InBand,
        Rank::InBand,
        "it sent an in-band error",
        "upstream_error",
    );

    /// A retryable HTTP status.
    pub(crate) fn status(status: StatusCode) -> Fault {
        Fault::new(
            UpstreamFailure::Status(status),
            Rank::Status,
            "it answered with an error status",
            "upstream_error",
        )
    }

    const fn new(
        kind: UpstreamFailure,
        rank: Rank,
        what: &'static str,
        code: &'static str,
    ) -> Fault {
        Fault {
            kind,
            rank,
            what,
            code,
        }
    }

    /// Whether this failure, of a later attempt, replaces `kept` as the one the client gets:
    /// it ranks at least as high (ties go to the later attempt, its information is the
    /// freshest).
    pub(crate) fn replaces(self, kept: Fault) -> bool {
        self.rank >= kept.rank
    }

    /// Whether the response of this failure is replayed to the client as it was sent, should
    /// every attempt fail: an error status or an in-band error is the upstream's own answer; a
    /// `2xx` stream with no token is no answer at all, and gets a rendered `502` instead.
    pub(crate) fn replayed(self) -> bool {
        self.rank >= Rank::Status
    }
}

/// What an attempt's response says so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing decided yet: read on.
    ReadOn,
    /// Commit to this attempt (hand it to the client as it is); `token` when it produced its
    /// first token (a TTFT sample).
    Commit { token: bool },
    /// The attempt failed before its first token: the next one may go out.
    Fail(Fault),
}

/// The response head, for a request that asked to stream when `stream_asked`. A retryable
/// status fails the attempt; a gRPC error status (a trailers-only response) fails it when
/// retryable and is returned as it is otherwise; any other status that is not a success is an
/// answer about the request itself, returned as it is; a success is read on for its first
/// token, unless the request asked to stream and the answer says it is not a stream.
pub(crate) fn of_head(
    cfg: &Config,
    status: StatusCode,
    headers: &HeaderMap,
    stream_asked: bool,
) -> Verdict {
    if cfg.retryable.contains(&status) {
        return Verdict::Fail(Fault::status(status));
    }
    match grpc_status(headers) {
        Some(code) if code != 0 => of_grpc_error(cfg, code),
        _ if !status.is_success() => Verdict::Commit { token: false },
        _ if stream_asked && not_a_stream(headers) => Verdict::Fail(Fault::NOT_A_STREAM),
        _ => Verdict::ReadOn,
    }
}

/// A `content-type` that names no stream (`application/json`, `text/plain`, ...; see
/// [`Dialect::resolve_stream`]). A head without one says nothing, and is read on as before.
fn not_a_stream(headers: &HeaderMap) -> bool {
    headers.contains_key(CONTENT_TYPE) && Dialect::Auto.resolve_stream(headers).is_none()
}

/// A data frame the tracker observed, with `held` bytes read before the first token so far
/// (this frame included). Junk fails the attempt, even in the frame of its first token (none
/// of it reached the client yet). A terminal event before any token ends the attempt: an
/// answer that ended empty (`finished`: a finish reason came first) is committed to, as a
/// plain proxy would pass it on; one with no finish reason (an interrupting server's bare
/// `[DONE]`) failed. A stream that can no longer be judged (an event over the
/// scanner's cap) or held (over the pre-token cap) fails open: it is committed to.
pub(crate) fn of_data(cfg: &Config, obs: &Observation, held: u64, finished: bool) -> Verdict {
    if obs.malformed {
        Verdict::Fail(Fault::MALFORMED)
    } else if obs.first_token {
        Verdict::Commit { token: true }
    } else if obs.error {
        Verdict::Fail(Fault::IN_BAND)
    } else if obs.done {
        no_token(finished)
    } else if obs.scan_error.is_some() || held > cfg.pre_token_cap as u64 {
        Verdict::Commit { token: false }
    } else {
        Verdict::ReadOn
    }
}

/// Trailers, which end the body: junk fails the attempt; a token they carried wins; else a gRPC error status decides
/// as in a trailers-only head; else the stream completed (`grpc-status: 0`) or was cut short
/// (no `grpc-status`) without a token.
pub(crate) fn of_trailers(cfg: &Config, obs: &Observation, trailers: &HeaderMap) -> Verdict {
    if obs.malformed {
        return Verdict::Fail(Fault::MALFORMED);
    }
    if obs.first_token {
        return Verdict::Commit { token: true };
    }
    match grpc_status(trailers) {
        Some(code) if code != 0 => of_grpc_error(cfg, code),
        _ if obs.error => Verdict::Fail(Fault::IN_BAND),
        Some(_) => Verdict::Fail(Fault::NO_TOKEN),
        None => Verdict::Fail(Fault::TRUNCATED),
    }
}

/// The end of the body, with what the tracker's last flush observed (a last NDJSON line may
/// have had no line end): junk fails the attempt; with no token and no terminal event, the
/// stream was cut short; with a terminal event, as in [`of_data`].
pub(crate) fn of_end(obs: &Observation, finished: bool) -> Verdict {
    if obs.malformed {
        Verdict::Fail(Fault::MALFORMED)
    } else if obs.first_token {
        Verdict::Commit { token: true }
    } else if obs.error {
        Verdict::Fail(Fault::IN_BAND)
    } else if obs.done {
        no_token(finished)
    } else {
        Verdict::Fail(Fault::TRUNCATED)
    }
}

/// A terminal event with no token before it: an empty answer when a finish reason came first,
/// else a stream that ended with nothing in it.
fn no_token(finished: bool) -> Verdict {
    if finished {
        Verdict::Commit { token: false }
    } else {
        Verdict::Fail(Fault::NO_TOKEN)
    }
}

/// A gRPC status other than `OK`: retryable codes fail the attempt, others are answers about
/// the request, returned as they are.
fn of_grpc_error(cfg: &Config, code: u16) -> Verdict {
    let code = GrpcCode::from_u16(code).unwrap_or(GrpcCode::Unknown);
    if cfg.retryable_grpc.contains(&code) {
        Verdict::Fail(Fault::IN_BAND)
    } else {
        Verdict::Commit { token: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn grpc(code: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from_static(code));
        h
    }

    fn obs(first_token: bool, error: bool) -> Observation {
        let mut o = Observation::default();
        o.first_token = first_token;
        o.error = error;
        o
    }

    const COMMIT: Verdict = Verdict::Commit { token: false };
    const TOKEN: Verdict = Verdict::Commit { token: true };

    #[test]
    fn heads() {
        let cfg = Config::default();
        let none = HeaderMap::new();
        assert_eq!(of_head(&cfg, StatusCode::OK, &none, false), Verdict::ReadOn);
        for s in [429, 500, 502, 503, 504] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(
                of_head(&cfg, s, &none, false),
                Verdict::Fail(Fault::status(s))
            );
        }
        // Answers about the request itself.
        for s in [400, 401, 404, 501, 302] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(of_head(&cfg, s, &none, false), COMMIT);
        }
        // Trailers-only gRPC: UNAVAILABLE is retryable, INVALID_ARGUMENT an answer, OK and
        // garbage (UNKNOWN, an answer) as gRPC reads them.
        let ok = StatusCode::OK;
        assert_eq!(
            of_head(&cfg, ok, &grpc("14"), false),
            Verdict::Fail(Fault::IN_BAND)
        );
        assert_eq!(of_head(&cfg, ok, &grpc("3"), false), COMMIT);
        assert_eq!(of_head(&cfg, ok, &grpc("0"), false), Verdict::ReadOn);
        assert_eq!(of_head(&cfg, ok, &grpc("x"), false), COMMIT);
        // A retryable HTTP status decides before a gRPC status.
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            of_head(&cfg, unavailable, &grpc("3"), false),
            Verdict::Fail(Fault::status(unavailable))
        );
        // The configured lists, not the defaults.
        let cfg = Config {
            retryable: Arc::new([StatusCode::NOT_FOUND]),
            retryable_grpc: Arc::new([GrpcCode::InvalidArgument]),
            ..Config::default()
        };
        let not_found = StatusCode::NOT_FOUND;
        assert_eq!(
            of_head(&cfg, not_found, &none, false),
            Verdict::Fail(Fault::status(not_found))
        );
        assert_eq!(of_head(&cfg, unavailable, &none, false), COMMIT);
        assert_eq!(
            of_head(&cfg, ok, &grpc("3"), false),
            Verdict::Fail(Fault::IN_BAND)
        );
        assert_eq!(of_head(&cfg, ok, &grpc("14"), false), COMMIT);
    }

    #[test]
    fn an_answer_that_is_no_stream_fails_a_request_that_asked_to_stream() {
        let cfg = Config::default();
        let ok = StatusCode::OK;
        let ct = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, http::HeaderValue::from_static(v));
            h
        };
        let not_a_stream = Verdict::Fail(Fault::NOT_A_STREAM);
        for v in [
            "application/json",
            "application/json; charset=utf-8",
            "text/plain",
        ] {
            assert_eq!(of_head(&cfg, ok, &ct(v), true), not_a_stream, "{v}");
            // A request that did not ask to stream (or said nothing) reads on as before.
            assert_eq!(of_head(&cfg, ok, &ct(v), false), Verdict::ReadOn, "{v}");
        }
        for v in [
            "text/event-stream",
            "application/x-ndjson",
            "application/grpc",
        ] {
            assert_eq!(of_head(&cfg, ok, &ct(v), true), Verdict::ReadOn, "{v}");
        }
        // No content-type says nothing; an error status is an answer (or retried) as before.
        assert_eq!(of_head(&cfg, ok, &HeaderMap::new(), true), Verdict::ReadOn);
        let json = ct("application/json");
        assert_eq!(of_head(&cfg, StatusCode::BAD_REQUEST, &json, true), COMMIT);
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            of_head(&cfg, unavailable, &json, true),
            Verdict::Fail(Fault::status(unavailable))
        );
        assert!(!Fault::NOT_A_STREAM.replayed());
        assert_eq!(Fault::NOT_A_STREAM.kind, UpstreamFailure::Protocol);
    }

    #[test]
    fn junk_fails_the_attempt_even_with_its_first_token() {
        let cfg = Config::default();
        let mut junk = obs(false, false);
        junk.malformed = true;
        let fail = Verdict::Fail(Fault::MALFORMED);
        assert_eq!(of_data(&cfg, &junk, 10, false), fail);
        // Over the pre-token cap too: the junk is known.
        assert_eq!(of_data(&cfg, &junk, u64::MAX, false), fail);
        let mut with_token = obs(true, false);
        with_token.malformed = true;
        assert_eq!(of_data(&cfg, &with_token, 10, false), fail);
        assert_eq!(of_end(&junk, false), fail);
        assert_eq!(of_trailers(&cfg, &with_token, &grpc("0")), fail);
        assert!(!Fault::MALFORMED.replayed());
        assert_eq!(Fault::MALFORMED.kind, UpstreamFailure::Protocol);
    }

    #[test]
    fn data_frames() {
        let cfg = Config {
            pre_token_cap: 100,
            ..Config::default()
        };
        assert_eq!(
            of_data(&cfg, &obs(false, false), 100, false),
            Verdict::ReadOn
        );
        assert_eq!(of_data(&cfg, &obs(true, false), 10, false), TOKEN);
        // A token in the frame wins over an error event after it, and over the cap.
        assert_eq!(of_data(&cfg, &obs(true, true), 10, false), TOKEN);
        assert_eq!(of_data(&cfg, &obs(true, false), 1000, false), TOKEN);
        assert_eq!(
            of_data(&cfg, &obs(false, true), 10, false),
            Verdict::Fail(Fault::IN_BAND)
        );
        // Over the pre-token cap, or past what the scanner can judge: fail open.
        assert_eq!(of_data(&cfg, &obs(false, false), 101, false), COMMIT);
        let mut unjudged = obs(false, false);
        unjudged.scan_error = Some(tailguard_core::ScanError::too_long("sse event", 10));
        assert_eq!(of_data(&cfg, &unjudged, 10, false), COMMIT);
        // A terminal event before any token: the attempt completed with none.
        let mut done = obs(false, false);
        done.done = true;
        assert_eq!(
            of_data(&cfg, &done, 10, false),
            Verdict::Fail(Fault::NO_TOKEN)
        );
        // ...after a finish reason: an empty answer, passed on as it is.
        assert_eq!(of_data(&cfg, &done, 10, true), COMMIT);
    }

    #[test]
    fn trailers() {
        let cfg = Config::default();
        let none = HeaderMap::new();
        assert_eq!(of_trailers(&cfg, &obs(true, false), &grpc("14")), TOKEN);
        assert_eq!(
            of_trailers(&cfg, &obs(false, false), &grpc("14")),
            Verdict::Fail(Fault::IN_BAND)
        );
        assert_eq!(of_trailers(&cfg, &obs(false, false), &grpc("3")), COMMIT);
        assert_eq!(
            of_trailers(&cfg, &obs(false, true), &none),
            Verdict::Fail(Fault::IN_BAND)
        );
        // A clean end with no message: complete, no token; trailers with no status: cut short.
        assert_eq!(
            of_trailers(&cfg, &obs(false, false), &grpc("0")),
            Verdict::Fail(Fault::NO_TOKEN)
        );
        assert_eq!(
            of_trailers(&cfg, &obs(false, false), &none),
            Verdict::Fail(Fault::TRUNCATED)
        );
    }

    #[test]
    fn ends() {
        assert_eq!(of_end(&obs(true, false), false), TOKEN);
        assert_eq!(
            of_end(&obs(false, true), false),
            Verdict::Fail(Fault::IN_BAND)
        );
        // No terminal event: cut short; a terminal event in the last flush: no token.
        assert_eq!(
            of_end(&obs(false, false), false),
            Verdict::Fail(Fault::TRUNCATED)
        );
        let mut done = obs(false, false);
        done.done = true;
        assert_eq!(of_end(&done, false), Verdict::Fail(Fault::NO_TOKEN));
        assert_eq!(of_end(&done, true), COMMIT);
    }

    #[test]
    fn the_most_informative_failure_is_kept_ties_to_the_later() {
        let status = Fault::status(StatusCode::SERVICE_UNAVAILABLE);
        // Lowest to highest, as documented on `FirstTokenHedge`.
        let order = [
            Fault::NO_RESPONSE,
            Fault::BODY_ERROR,
            status,
            Fault::IN_BAND,
        ];
        for (i, a) in order.iter().enumerate() {
            for (j, b) in order.iter().enumerate() {
                assert_eq!(a.replaces(*b), i >= j, "{a:?} over {b:?}");
            }
        }
        let no_token = [
            Fault::NO_TOKEN,
            Fault::TRUNCATED,
            Fault::BODY_ERROR,
            Fault::MALFORMED,
            Fault::NOT_A_STREAM,
        ];
        for a in no_token {
            for b in no_token {
                assert!(a.replaces(b), "{a:?} over {b:?}");
            }
        }
        let other = Fault::status(StatusCode::TOO_MANY_REQUESTS);
        assert!(other.replaces(status) && status.replaces(other));
    }

    #[test]
    fn only_an_upstreams_own_answer_is_replayed() {
        let status = Fault::status(StatusCode::SERVICE_UNAVAILABLE);
        assert!(status.replayed() && Fault::IN_BAND.replayed());
        for f in [Fault::BODY_ERROR, Fault::NO_TOKEN, Fault::TRUNCATED] {
            assert!(!f.replayed(), "{f:?}");
        }
    }
}
