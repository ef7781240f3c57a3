//! The deadline of a request: the one source of "time left" that every layer reads, the
//! client's own deadline read from its request, and the budget sent on upstream.
//!
//! * [`Deadlines`] in the request extensions is the time left. `SseIdleTimeout` puts its own
//!   first-token and total limits there; a client's deadline tightens the total one.
//! * [`ClientDeadline`] reads the client's deadline: `grpc-timeout` on a gRPC request, a
//!   configurable header (default [`REQUEST_TIMEOUT`]) on the others. The first layer that calls
//!   [`ClientDeadline::accept`] reads it, at arrival; later calls find it read and do nothing,
//!   so the time a request spends in an admission queue counts against the client's deadline.
//! * [`propagate`] writes what is left of the total deadline into an outgoing request, in the
//!   same header, so a deadline-aware upstream can drop work nobody waits for.

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use tokio::time::Instant;

/// `grpc-timeout`: a gRPC call's deadline, `<1 to 8 digits><unit>` with unit `H`, `M`, `S`,
/// `m` (milliseconds), `u` or `n`.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// `x-request-timeout`: the default header of an HTTP client's deadline (seconds, `2.5`, or a
/// duration, `1500ms`, `2s`, `1m`).
pub const REQUEST_TIMEOUT: HeaderName = HeaderName::from_static("x-request-timeout");

/// The deadlines of one request: the one source of "time left" that every layer reads.
///
/// The layer that decides a request's limits (`SseIdleTimeout`, from its configuration, the
/// request's class and its overrides) puts this into the request extensions before it calls the
/// inner service; a client's own deadline ([`ClientDeadline`]) sets or tightens the total one.
/// Every layer reads what is left: admission does not queue past it, the timeouts fire at it,
/// the hedge never plans past it and sends no backup that could not win. A layer that learns of
/// a tighter deadline tightens it with [`Deadlines::tighten`], never loosens it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// When the first token must have arrived.
    pub first_token: Option<Instant>,
    /// When the whole stream must have ended.
    pub total: Option<Instant>,
}

impl Deadlines {
    /// Time left until the first-token deadline (or the total one, if that is earlier) at `now`;
    /// `None` when neither is set, zero once passed.
    pub fn first_token_left(&self, now: Instant) -> Option<Duration> {
        Some(earlier(self.first_token, self.total)?.saturating_duration_since(now))
    }

    /// Time left until the total deadline at `now`; `None` when it is not set.
    pub fn total_left(&self, now: Instant) -> Option<Duration> {
        Some(self.total?.saturating_duration_since(now))
    }

    /// Keeps the earlier of each pair of deadlines.
    pub fn tighten(&mut self, other: Deadlines) {
        self.first_token = earlier(self.first_token, other.first_token);
        self.total = earlier(self.total, other.total);
    }

    /// Tightens the `Deadlines` in `extensions` with `other`, or inserts `other` when there is
    /// none (and `other` sets anything).
    pub fn tighten_in(extensions: &mut http::Extensions, other: Deadlines) {
        match extensions.get_mut::<Deadlines>() {
            Some(d) => d.tighten(other),
            None if other != Deadlines::default() => {
                extensions.insert(other);
            }
            None => {}
        }
    }
}

fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How a client's own deadline is read from its request and sent on upstream.
///
/// [`new`](ClientDeadline::new): `grpc-timeout` is read on gRPC requests and sent on, the
/// [`REQUEST_TIMEOUT`] header is read on the others and not sent on. Reading is on by default
/// because a client's deadline only ever shortens its own request (it tightens [`Deadlines`],
/// never loosens a configured limit), so honouring it costs no other request anything and saves
/// the work nobody waits for. gRPC's budget is sent on by default because gRPC proxies are
/// expected to propagate deadlines (and the client's header would otherwise travel on stale);
/// the HTTP header is not, because an upstream that does not know it gains nothing from it.
///
/// A value that does not parse is ignored (the request keeps the configured limits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientDeadline {
    grpc: bool,
    header: Option<HeaderName>,
    propagate_header: bool,
}

impl Default for ClientDeadline {
    fn default() -> Self {
        Self::new()
    }
}

/// Marks a request whose deadline was read; says what [`propagate`] writes.
#[derive(Clone, Debug)]
struct Accepted {
    grpc: bool,
    header: Option<HeaderName>,
}

impl ClientDeadline {
    /// Reads and sends on `grpc-timeout`; reads [`REQUEST_TIMEOUT`] on other requests without
    /// sending it on.
    pub fn new() -> Self {
        ClientDeadline {
            grpc: true,
            header: Some(REQUEST_TIMEOUT),
            propagate_header: false,
        }
    }

    /// Reads nothing and sends nothing on: requests keep the configured limits.
    pub fn disabled() -> Self {
        ClientDeadline {
            grpc: false,
            header: None,
            propagate_header: false,
        }
    }

    /// Reads the HTTP deadline from `name` instead of [`REQUEST_TIMEOUT`].
    pub fn with_header(mut self, name: HeaderName) -> Self {
        self.header = Some(name);
        self
    }

    /// Reads no HTTP header (`grpc-timeout` still applies to gRPC requests).
    pub fn without_header(mut self) -> Self {
        self.header = None;
        self
    }

    /// Whether `grpc-timeout` is read, and sent on, for gRPC requests.
    pub fn with_grpc(mut self, grpc: bool) -> Self {
        self.grpc = grpc;
        self
    }

    /// Whether the HTTP header is sent on upstream with the budget left (default: no).
    pub fn with_propagation(mut self, propagate: bool) -> Self {
        self.propagate_header = propagate;
        self
    }

    /// The HTTP header read, if any.
    pub fn header(&self) -> Option<&HeaderName> {
        self.header.as_ref()
    }

    /// The deadline the client sent in `headers`, as time left: `grpc-timeout` for a gRPC
    /// request, the configured header for the others; `None` when absent or unparseable.
    pub fn read(&self, headers: &HeaderMap) -> Option<Duration> {
        if is_grpc(headers) {
            self.grpc
                .then(|| headers.get(GRPC_TIMEOUT))
                .flatten()
                .and_then(|v| parse_grpc_timeout(v.as_bytes()))
        } else {
            let v = headers.get(self.header.as_ref()?)?;
            parse_duration(v.to_str().ok()?)
        }
    }

    /// Reads the client's deadline of `req` once: the first call (at `now`, the arrival)
    /// tightens the request's [`Deadlines`] with it and records what [`propagate`] sends on;
    /// later calls, from layers further in, read nothing again but may add what they send on
    /// (`grpc-timeout`, or their header when [`with_propagation`](Self::with_propagation) is
    /// set). Layers that act on the time left call this before they read [`Deadlines`], so any
    /// subset of them works.
    pub fn accept<B>(&self, req: &mut Request<B>, now: Instant) {
        if let Some(a) = req.extensions_mut().get_mut::<Accepted>() {
            // Read already; a layer further in may still ask for the budget to be sent on.
            a.grpc |= self.grpc;
            if self.propagate_header && a.header.is_none() {
                a.header = self.header.clone();
            }
            return;
        }
        let total = self.read(req.headers()).and_then(|d| now.checked_add(d));
        let ext = req.extensions_mut();
        ext.insert(Accepted {
            grpc: self.grpc,
            header: self.header.clone().filter(|_| self.propagate_header),
        });
        Deadlines::tighten_in(
            ext,
            Deadlines {
                first_token: None,
                total,
            },
        );
    }
}

/// Writes what is left at `now` of `req`'s total deadline into its header, as the accepted
/// [`ClientDeadline`] says: `grpc-timeout` on a gRPC request, the HTTP header (when sent on)
/// on the others. Nothing without a total deadline or an accepted `ClientDeadline`.
///
/// Called where a request leaves for the upstream: by `SseIdleTimeout` as it calls in, and by
/// the hedge for every attempt, so a backup carries what is left when it is sent.
pub fn propagate<B>(req: &mut Request<B>, now: Instant) {
    let ext = req.extensions();
    let (Some(accepted), Some(left)) = (
        ext.get::<Accepted>(),
        ext.get::<Deadlines>().and_then(|d| d.total_left(now)),
    ) else {
        return;
    };
    if is_grpc(req.headers()) {
        if accepted.grpc {
            req.headers_mut()
                .insert(GRPC_TIMEOUT, grpc_timeout_value(left));
        }
    } else if let Some(name) = accepted.header.clone()
        && let Ok(v) = HeaderValue::try_from(format!("{}ms", left.as_millis()))
    {
        req.headers_mut().insert(name, v);
    }
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`, `m`, `u`,
/// `n`); `None` otherwise.
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `grpc-timeout` value for `d`: milliseconds (rounded down) while they fit in 8 digits,
/// then seconds, then hours (at most 99999999 hours).
pub fn grpc_timeout_value(d: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let (n, unit) = if d.as_millis() <= MAX {
        (d.as_millis(), "m")
    } else if u128::from(d.as_secs()) <= MAX {
        (u128::from(d.as_secs()), "S")
    } else {
        (u128::from(d.as_secs() / 3600).min(MAX), "H")
    };
    HeaderValue::try_from(format!("{n}{unit}")).unwrap_or(HeaderValue::from_static("99999999H"))
}

/// Parses a deadline header: seconds (`2.5`, `30`) or a number with a unit `ms`, `s` or `m`
/// (`1500ms`, `2s`, `1.5m`); surrounding whitespace is ignored. `None` for anything else,
/// negative or not finite.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let v = value.trim();
    let (number, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v, 1.0)
    };
    let n: f64 = number.trim_end().parse().ok()?;
    Duration::try_from_secs_f64(n * scale).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_and_format() {
        for (v, d) in [
            ("2S", Duration::from_secs(2)),
            ("1500m", Duration::from_millis(1500)),
            ("1H", Duration::from_secs(3600)),
            ("3M", Duration::from_secs(180)),
            ("7u", Duration::from_micros(7)),
            ("99999999n", Duration::from_nanos(99_999_999)),
        ] {
            assert_eq!(parse_grpc_timeout(v.as_bytes()), Some(d), "{v}");
        }
        for v in ["", "S", "123456789S", "1s", "-1S", "1.5S", " 1S"] {
            assert_eq!(parse_grpc_timeout(v.as_bytes()), None, "{v:?}");
        }
        assert_eq!(grpc_timeout_value(Duration::from_millis(1999)), "1999m");
        assert_eq!(grpc_timeout_value(Duration::from_secs(200_000)), "200000S");
        assert_eq!(grpc_timeout_value(Duration::MAX), "99999999H");
    }

    #[test]
    fn header_durations_parse() {
        for (v, ms) in [
            ("2.5", 2500),
            ("30", 30_000),
            ("1500ms", 1500),
            (" 2s ", 2000),
            ("1.5m", 90_000),
            ("0", 0),
        ] {
            assert_eq!(parse_duration(v), Some(Duration::from_millis(ms)), "{v}");
        }
        for v in ["", "-1", "soon", "1h", "NaN", "inf", "1e400"] {
            assert_eq!(parse_duration(v), None, "{v:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_accept_reads_and_propagate_sends_what_is_left() {
        let t0 = Instant::now();
        let mut req = Request::new(());
        req.headers_mut()
            .insert(REQUEST_TIMEOUT, HeaderValue::from_static("2.5"));
        let cd = ClientDeadline::new().with_propagation(true);
        cd.accept(&mut req, t0);
        // A later layer's accept does not move the deadline.
        cd.accept(&mut req, t0 + Duration::from_secs(1));
        let d = req.extensions().get::<Deadlines>().copied().unwrap();
        assert_eq!(d.total, Some(t0 + Duration::from_millis(2500)));
        propagate(&mut req, t0 + Duration::from_millis(700));
        assert_eq!(req.headers()[REQUEST_TIMEOUT], "1800ms");

        let mut grpc = Request::new(());
        let h = grpc.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_TIMEOUT, HeaderValue::from_static("2S"));
        h.insert(REQUEST_TIMEOUT, HeaderValue::from_static("9"));
        ClientDeadline::new().accept(&mut grpc, t0);
        propagate(&mut grpc, t0 + Duration::from_millis(500));
        assert_eq!(grpc.headers()[GRPC_TIMEOUT], "1500m");
        assert_eq!(
            grpc.headers()[REQUEST_TIMEOUT],
            "9",
            "not sent on by default"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_read_or_sent_when_disabled() {
        let t0 = Instant::now();
        let mut req = Request::new(());
        req.headers_mut()
            .insert(REQUEST_TIMEOUT, HeaderValue::from_static("1"));
        ClientDeadline::disabled().accept(&mut req, t0);
        assert_eq!(req.extensions().get::<Deadlines>(), None);
        ClientDeadline::new().accept(&mut req, t0);
        assert_eq!(req.extensions().get::<Deadlines>(), None, "read once");
        // Without a propagating header the client's own value travels untouched.
        Deadlines::tighten_in(
            req.extensions_mut(),
            Deadlines {
                first_token: None,
                total: Some(t0),
            },
        );
        propagate(&mut req, t0);
        assert_eq!(req.headers()[REQUEST_TIMEOUT], "1");
    }
}
