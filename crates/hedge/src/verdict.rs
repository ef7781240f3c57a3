//! What an attempt's response says before its first token: plain decisions on its head, its
//! frames and its end, with no polling and no state of their own.

use http::{HeaderMap, StatusCode};
use tailguard_core::headers::grpc_status;
use tailguard_core::{GrpcCode, Observation, UpstreamFailure};

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
}

impl Fault {
    /// The inner service returned an error instead of a response.
    pub(crate) const NO_RESPONSE: Fault = Fault::new(UpstreamFailure::Transport, Rank::NoResponse);
    /// The response body failed before its first token.
    pub(crate) const BODY_ERROR: Fault = Fault::new(UpstreamFailure::Transport, Rank::NoToken);
    /// The stream completed (its terminal event, or gRPC trailers with `OK`) without a token.
    pub(crate) const NO_TOKEN: Fault = Fault::new(UpstreamFailure::Protocol, Rank::NoToken);
    /// The body ended before its first token and before its terminal event (half an event, a
    /// stream cut short).
    pub(crate) const TRUNCATED: Fault = Fault::new(UpstreamFailure::Truncated, Rank::NoToken);
    /// An in-band error event, or a retryable gRPC status.
    pub(crate) const IN_BAND: Fault = Fault::new(UpstreamFailure::InBand, Rank::InBand);

    /// A retryable HTTP status.
    pub(crate) fn status(status: StatusCode) -> Fault {
        Fault::new(UpstreamFailure::Status(status), Rank::Status)
    }

    const fn new(kind: UpstreamFailure, rank: Rank) -> Fault {
        Fault { kind, rank }
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

/// The response head. A retryable status fails the attempt; a gRPC error status (a
/// trailers-only response) fails it when retryable and is returned as it is otherwise; any
/// other status that is not a success is an answer about the request itself, returned as it
/// is; a success is read on for its first token.
pub(crate) fn of_head(cfg: &Config, status: StatusCode, headers: &HeaderMap) -> Verdict {
    if cfg.retryable.contains(&status) {
        return Verdict::Fail(Fault::status(status));
    }
    match grpc_status(headers) {
        Some(code) if code != 0 => of_grpc_error(cfg, code),
        _ if !status.is_success() => Verdict::Commit { token: false },
        _ => Verdict::ReadOn,
    }
}

/// A data frame the tracker observed, with `held` bytes read before the first token so far
/// (this frame included). A terminal event before any token ends the attempt (it completed
/// with no token). A stream that can no longer be judged (an event over the scanner's cap) or
/// held (over the pre-token cap) fails open: it is committed to.
pub(crate) fn of_data(cfg: &Config, obs: &Observation, held: u64) -> Verdict {
    if obs.first_token {
        Verdict::Commit { token: true }
    } else if obs.error {
        Verdict::Fail(Fault::IN_BAND)
    } else if obs.done {
        Verdict::Fail(Fault::NO_TOKEN)
    } else if obs.scan_error.is_some() || held > cfg.pre_token_cap as u64 {
        Verdict::Commit { token: false }
    } else {
        Verdict::ReadOn
    }
}

/// Trailers, which end the body: a token they carried wins; else a gRPC error status decides
/// as in a trailers-only head; else the stream completed (`grpc-status: 0`) or was cut short
/// (no `grpc-status`) without a token.
pub(crate) fn of_trailers(cfg: &Config, obs: &Observation, trailers: &HeaderMap) -> Verdict {
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
/// have had no line end): with no token and no terminal event, the stream was cut short.
pub(crate) fn of_end(obs: &Observation) -> Verdict {
    if obs.first_token {
        Verdict::Commit { token: true }
    } else if obs.error {
        Verdict::Fail(Fault::IN_BAND)
    } else if obs.done {
        Verdict::Fail(Fault::NO_TOKEN)
    } else {
        Verdict::Fail(Fault::TRUNCATED)
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
        assert_eq!(of_head(&cfg, StatusCode::OK, &none), Verdict::ReadOn);
        for s in [429, 500, 502, 503, 504] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(of_head(&cfg, s, &none), Verdict::Fail(Fault::status(s)));
        }
        // Answers about the request itself.
        for s in [400, 401, 404, 501, 302] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(of_head(&cfg, s, &none), COMMIT);
        }
        // Trailers-only gRPC: UNAVAILABLE is retryable, INVALID_ARGUMENT an answer, OK and
        // garbage (UNKNOWN, an answer) as gRPC reads them.
        let ok = StatusCode::OK;
        assert_eq!(
            of_head(&cfg, ok, &grpc("14")),
            Verdict::Fail(Fault::IN_BAND)
        );
        assert_eq!(of_head(&cfg, ok, &grpc("3")), COMMIT);
        assert_eq!(of_head(&cfg, ok, &grpc("0")), Verdict::ReadOn);
        assert_eq!(of_head(&cfg, ok, &grpc("x")), COMMIT);
        // A retryable HTTP status decides before a gRPC status.
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            of_head(&cfg, unavailable, &grpc("3")),
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
            of_head(&cfg, not_found, &none),
            Verdict::Fail(Fault::status(not_found))
        );
        assert_eq!(of_head(&cfg, unavailable, &none), COMMIT);
        assert_eq!(of_head(&cfg, ok, &grpc("3")), Verdict::Fail(Fault::IN_BAND));
        assert_eq!(of_head(&cfg, ok, &grpc("14")), COMMIT);
    }

    #[test]
    fn data_frames() {
        let cfg = Config {
            pre_token_cap: 100,
            ..Config::default()
        };
        assert_eq!(of_data(&cfg, &obs(false, false), 100), Verdict::ReadOn);
        assert_eq!(of_data(&cfg, &obs(true, false), 10), TOKEN);
        // A token in the frame wins over an error event after it, and over the cap.
        assert_eq!(of_data(&cfg, &obs(true, true), 10), TOKEN);
        assert_eq!(of_data(&cfg, &obs(true, false), 1000), TOKEN);
        assert_eq!(
            of_data(&cfg, &obs(false, true), 10),
            Verdict::Fail(Fault::IN_BAND)
        );
        // Over the pre-token cap, or past what the scanner can judge: fail open.
        assert_eq!(of_data(&cfg, &obs(false, false), 101), COMMIT);
        let mut unjudged = obs(false, false);
        unjudged.scan_error = Some(tailguard_core::ScanError::too_long("sse event", 10));
        assert_eq!(of_data(&cfg, &unjudged, 10), COMMIT);
        // A terminal event before any token: the attempt completed with none.
        let mut done = obs(false, false);
        done.done = true;
        assert_eq!(of_data(&cfg, &done, 10), Verdict::Fail(Fault::NO_TOKEN));
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
        assert_eq!(of_end(&obs(true, false)), TOKEN);
        assert_eq!(of_end(&obs(false, true)), Verdict::Fail(Fault::IN_BAND));
        // No terminal event: cut short; a terminal event in the last flush: no token.
        assert_eq!(of_end(&obs(false, false)), Verdict::Fail(Fault::TRUNCATED));
        let mut done = obs(false, false);
        done.done = true;
        assert_eq!(of_end(&done), Verdict::Fail(Fault::NO_TOKEN));
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
        for a in [Fault::NO_TOKEN, Fault::TRUNCATED, Fault::BODY_ERROR] {
            for b in [Fault::NO_TOKEN, Fault::TRUNCATED, Fault::BODY_ERROR] {
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
