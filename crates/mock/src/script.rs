//! Scripts: what one replica (or one request) does, and its compact header syntax.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::StatusCode;

use crate::rng::SplitMix64;

/// The longest latency a distribution can draw (one hour): keeps a heavy-tailed draw from
/// overflowing a `Duration` or a timer.
pub const MAX_LATENCY: Duration = Duration::from_secs(3600);

/// A latency: fixed, or drawn from a seeded distribution.
///
/// Draws are deterministic: a replica gives request number *k* the same draw on every run with
/// the same seed, whatever the interleaving of concurrent requests.
#[derive(Clone, Debug, PartialEq)]
pub enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Log-normal with the given median and shape `sigma` (the standard deviation of the
    /// logarithm): `median * exp(sigma * N(0,1))`. `sigma = 0.5` gives p99 ≈ 3.2× the median.
    LogNormal {
        /// The median draw.
        median: Duration,
        /// Standard deviation of `ln(latency)`; must be finite and ≥ 0.
        sigma: f64,
    },
    /// With probability `slow_fraction` a draw from `slow`, otherwise from `base`: "5% of
    /// requests take 10x".
    Mixture {
        /// The usual latency.
        base: Box<Latency>,
        /// The latency of the slow fraction.
        slow: Box<Latency>,
        /// Probability of a slow draw, in `[0, 1]`.
        slow_fraction: f64,
    },
}

impl Default for Latency {
    /// Zero: the mock answers as fast as the machine allows unless told otherwise.
    fn default() -> Self {
        Latency::Fixed(Duration::ZERO)
    }
}

impl From<Duration> for Latency {
    fn from(d: Duration) -> Self {
        Latency::Fixed(d)
    }
}

impl Latency {
    /// A fixed latency of `ms` milliseconds.
    pub fn ms(ms: u64) -> Self {
        Latency::Fixed(Duration::from_millis(ms))
    }

    /// A log-normal latency.
    pub fn log_normal(median: Duration, sigma: f64) -> Self {
        Latency::LogNormal { median, sigma }
    }

    /// `base`, except a `slow_fraction` of draws come from `slow`.
    pub fn mixture(base: Latency, slow: Latency, slow_fraction: f64) -> Self {
        Latency::Mixture {
            base: Box::new(base),
            slow: Box::new(slow),
            slow_fraction,
        }
    }

    /// One draw, capped at [`MAX_LATENCY`]. Invalid parameters (negative or non-finite sigma
    /// or fraction) are clamped, never a panic.
    pub fn sample(&self, rng: &mut SplitMix64) -> Duration {
        match self {
            Latency::Fixed(d) => (*d).min(MAX_LATENCY),
            Latency::LogNormal { median, sigma } => {
                let sigma = if sigma.is_finite() {
                    sigma.max(0.0)
                } else {
                    0.0
                };
                let z = rng.next_normal();
                let secs = median.as_secs_f64() * (sigma * z).exp();
                Duration::try_from_secs_f64(secs)
                    .unwrap_or(MAX_LATENCY)
                    .min(MAX_LATENCY)
            }
            Latency::Mixture {
                base,
                slow,
                slow_fraction,
            } => {
                let f = if slow_fraction.is_finite() {
                    slow_fraction.clamp(0.0, 1.0)
                } else {
                    0.0
                };
                if rng.next_f64() < f {
                    slow.sample(rng)
                } else {
                    base.sample(rng)
                }
            }
        }
    }

    /// The value of a fixed latency.
    pub fn as_fixed(&self) -> Option<Duration> {
        match self {
            Latency::Fixed(d) => Some(*d),
            _ => None,
        }
    }
}

impl fmt::Display for Latency {
    /// The header syntax: `250ms`, `lognormal(200ms,0.5)`, `mix(0.05,100ms,1s)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Latency::Fixed(d) => write!(f, "{}", DurationFmt(*d)),
            Latency::LogNormal { median, sigma } => {
                write!(f, "lognormal({},{sigma})", DurationFmt(*median))
            }
            Latency::Mixture {
                base,
                slow,
                slow_fraction,
            } => write!(f, "mix({slow_fraction},{base},{slow})"),
        }
    }
}

impl FromStr for Latency {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let s = s.trim();
        if let Some(inner) = strip_call(s, "lognormal") {
            let parts = split_top(inner, ',');
            if parts.len() != 2 {
                return Err(ParseError::new(s, "lognormal takes (median,sigma)"));
            }
            let median = parse_duration(parts[0])?;
            let sigma = parse_f64(parts[1])?;
            if sigma < 0.0 {
                return Err(ParseError::new(s, "sigma must be >= 0"));
            }
            return Ok(Latency::LogNormal { median, sigma });
        }
        if let Some(inner) = strip_call(s, "mix") {
            let parts = split_top(inner, ',');
            if parts.len() != 3 {
                return Err(ParseError::new(s, "mix takes (slow_fraction,base,slow)"));
            }
            let frac = parse_f64(parts[0])?;
            if !(0.0..=1.0).contains(&frac) {
                return Err(ParseError::new(s, "slow_fraction must be in [0,1]"));
            }
            return Ok(Latency::mixture(parts[1].parse()?, parts[2].parse()?, frac));
        }
        if let Some(inner) = strip_call(s, "fixed") {
            return Ok(Latency::Fixed(parse_duration(inner)?));
        }
        Ok(Latency::Fixed(parse_duration(s)?))
    }
}

/// How the connection is broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Reset {
    /// Not at all.
    #[default]
    None,
    /// Before the response head: HTTP/1.1 closes the connection, HTTP/2 resets the stream.
    BeforeHeaders,
    /// After this many tokens: the body fails, so HTTP/1.1 closes the connection mid-body and
    /// HTTP/2 resets the stream.
    AfterTokens(u32),
}

/// What one request (or every request of a replica) does. A builder: start from
/// [`Script::new`] and chain.
///
/// The timeline of a streaming response is: `head_delay` → response head (200 OK) → (with
/// `early_meta`, the default) the role-only chunk / `message_start` → wait for the single slot
/// (in single-slot mode) → `ttft` → token 1 → `gap` → token 2 → … → finish chunk → usage chunk
/// (if asked) → `data: [DONE]`. Keepalive comments are sent every `keepalive_every` from the
/// head on, during every wait (TTFT, gaps, stalls). A stall after token *N* inserts a pause (or
/// an endless one) after that token; an error event after token *N* ends the stream there with
/// an in-band error; a reset after token *N* breaks the connection there.
///
/// A non-streamed request (no `"stream": true`) waits out the same timeline (slot, TTFT, gaps,
/// stalls) and then sends the whole JSON body at once; an in-band error becomes an HTTP 500,
/// a reset after *N* tokens breaks the connection before the head, and no keepalives are sent.
///
/// Also parsed from (and printed to) a compact header syntax, see [`Script::apply`].
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    pub(crate) head_delay: Duration,
    pub(crate) ttft: Latency,
    pub(crate) tokens: u32,
    pub(crate) gap: Latency,
    pub(crate) stall_after: Option<(u32, Option<Duration>)>,
    pub(crate) keepalive_every: Option<Duration>,
    pub(crate) status: Option<StatusCode>,
    pub(crate) status_fraction: f64,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) reset: Reset,
    pub(crate) error_event_after: Option<u32>,
    pub(crate) single_slot: bool,
    pub(crate) seed: u64,
    pub(crate) early_meta: bool,
    pub(crate) tool_calls: bool,
}

impl Default for Script {
    fn default() -> Self {
        Script::new()
    }
}

/// Default number of tokens: 8, enough to have gaps to measure and short enough to read in a
/// failing test's output.
pub const DEFAULT_TOKENS: u32 = 8;

/// Default seed of the latency distributions.
pub const DEFAULT_SEED: u64 = 0x7a11_6a4d;

impl Script {
    /// A well-behaved upstream: no delays, [`DEFAULT_TOKENS`] tokens back to back, no errors,
    /// role-only chunk right after the head, seed [`DEFAULT_SEED`].
    pub fn new() -> Self {
        Script {
            head_delay: Duration::ZERO,
            ttft: Latency::default(),
            tokens: DEFAULT_TOKENS,
            gap: Latency::default(),
            stall_after: None,
            keepalive_every: None,
            status: None,
            status_fraction: 1.0,
            retry_after: None,
            reset: Reset::None,
            error_event_after: None,
            single_slot: false,
            seed: DEFAULT_SEED,
            early_meta: true,
            tool_calls: false,
        }
    }

    /// Delay before the response head is sent (default 0).
    pub fn head_delay(mut self, d: Duration) -> Self {
        self.head_delay = d;
        self
    }

    /// Time from the response head to the first token (default 0). In single-slot mode the
    /// wait for the slot comes on top.
    pub fn ttft(mut self, l: impl Into<Latency>) -> Self {
        self.ttft = l.into();
        self
    }

    /// Number of tokens (content chunks) to send (default [`DEFAULT_TOKENS`]).
    pub fn tokens(mut self, n: u32) -> Self {
        self.tokens = n;
        self
    }

    /// Time between two tokens (default 0), drawn afresh for every gap when it is a
    /// distribution.
    pub fn gap(mut self, l: impl Into<Latency>) -> Self {
        self.gap = l.into();
        self
    }

    /// After token `n` (0 = before the first token, right after the TTFT wait), pause for
    /// `pause`, or forever with `None` (keepalives, if any, go on).
    pub fn stall_after(mut self, n: u32, pause: Option<Duration>) -> Self {
        self.stall_after = Some((n, pause));
        self
    }

    /// Send an SSE keepalive every `every` from the response head on (OpenAI: `: keepalive`
    /// comment; Anthropic: `event: ping`). Off by default. Zero turns it off.
    pub fn keepalive_every(mut self, every: Duration) -> Self {
        self.keepalive_every = (!every.is_zero()).then_some(every);
        self
    }

    /// Answer with this HTTP status (after `head_delay`) and an error body in the route's
    /// dialect instead of a completion. gRPC maps it to a trailers-only `grpc-status`.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }

    /// Only this fraction of requests (drawn with the seed) get [`status`](Self::status); the
    /// rest are served normally (default 1.0).
    pub fn status_fraction(mut self, f: f64) -> Self {
        self.status_fraction = f;
        self
    }

    /// Send `Retry-After` (whole seconds, rounded up) with an error status.
    pub fn retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// Break the connection before the response head (after `head_delay`).
    pub fn reset_before_headers(mut self) -> Self {
        self.reset = Reset::BeforeHeaders;
        self
    }

    /// Break the connection after `n` tokens.
    pub fn reset_after_tokens(mut self, n: u32) -> Self {
        self.reset = Reset::AfterTokens(n);
        self
    }

    /// End the stream after `n` tokens with an in-band error event (OpenAI
    /// `data: {"error":..}` then `data: [DONE]`; Anthropic `event: error`; gRPC trailers with
    /// `grpc-status` 13).
    pub fn error_event_after(mut self, n: u32) -> Self {
        self.error_event_after = Some(n);
        self
    }

    /// Single-slot mode: requests with this set take the replica's one generation slot (after
    /// the response head, before the TTFT wait) and hold it until their body ends or is dropped,
    /// so concurrent requests queue behind each other (head-of-line blocking, as in a busy
    /// inference server). Off by default.
    pub fn single_slot(mut self, on: bool) -> Self {
        self.single_slot = on;
        self
    }

    /// Seed of the latency draws (default [`DEFAULT_SEED`]). Request *k* of a replica draws
    /// from a generator seeded with a mix of `seed` and *k*.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether the meta events that precede the first token (OpenAI role-only chunk, Anthropic
    /// `message_start`/`content_block_start`/`ping`) are sent right after the head (`true`, the
    /// default: the case that fools a layer watching for "the first frame") or right before the
    /// first token.
    pub fn early_meta(mut self, on: bool) -> Self {
        self.early_meta = on;
        self
    }

    /// OpenAI chat: stream `tool_calls` argument deltas instead of text content (as in the
    /// `llmock-openai-tool-call-stream.sse` fixture). Off by default.
    pub fn tool_calls(mut self, on: bool) -> Self {
        self.tool_calls = on;
        self
    }

    /// The number of tokens.
    pub fn token_count(&self) -> u32 {
        self.tokens
    }

    /// Applies overrides in the header syntax to a copy of this script.
    ///
    /// Comma-separated `key=value` pairs (whitespace ignored); a key not given keeps its value:
    ///
    /// | key | value | builder |
    /// |---|---|---|
    /// | `head_delay` | duration | [`head_delay`](Self::head_delay) |
    /// | `ttft` | latency | [`ttft`](Self::ttft) |
    /// | `tokens` | integer | [`tokens`](Self::tokens) |
    /// | `gap` | latency | [`gap`](Self::gap) |
    /// | `stall_after` | integer or `none` | [`stall_after`](Self::stall_after) (forever unless `stall_for`) |
    /// | `stall_for` | duration or `forever` | the pause of `stall_after` |
    /// | `keepalive` | duration or `none` | [`keepalive_every`](Self::keepalive_every) |
    /// | `status` | integer or `none` | [`status`](Self::status) |
    /// | `status_fraction` | number | [`status_fraction`](Self::status_fraction) |
    /// | `retry_after` | duration or `none` | [`retry_after`](Self::retry_after) |
    /// | `reset` | `before_headers`, `none`, or an integer *n* (after *n* tokens) | [`reset_before_headers`](Self::reset_before_headers), [`reset_after_tokens`](Self::reset_after_tokens) |
    /// | `reset_after` | integer | [`reset_after_tokens`](Self::reset_after_tokens) |
    /// | `error_after` | integer or `none` | [`error_event_after`](Self::error_event_after) |
    /// | `single_slot` | bool | [`single_slot`](Self::single_slot) |
    /// | `seed` | integer | [`seed`](Self::seed) |
    /// | `early_meta` | bool | [`early_meta`](Self::early_meta) |
    /// | `tool_calls` | bool | [`tool_calls`](Self::tool_calls) |
    ///
    /// A duration is a number with a unit `ns`, `us`, `ms`, `s`, `m` or `h` (`0` alone is allowed).
    /// A latency is a duration, `fixed(D)`, `lognormal(MEDIAN,SIGMA)` or
    /// `mix(SLOW_FRACTION,BASE,SLOW)` (nestable). A bool is `true`/`false`/`1`/`0`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tailguard_mock::{Latency, Script};
    ///
    /// let s = Script::new()
    ///     .apply("ttft=mix(0.05,lognormal(200ms,0.5),2s), tokens=20, gap=5ms, stall_after=3")
    ///     .unwrap();
    /// assert_eq!(s.token_count(), 20);
    /// assert_eq!(s, Script::new()
    ///     .ttft(Latency::mixture(
    ///         Latency::log_normal(Duration::from_millis(200), 0.5),
    ///         Latency::Fixed(Duration::from_secs(2)),
    ///         0.05,
    ///     ))
    ///     .tokens(20)
    ///     .gap(Duration::from_millis(5))
    ///     .stall_after(3, None));
    /// // Printing gives the same syntax back.
    /// assert_eq!(s.to_string().parse::<Script>().unwrap(), s);
    /// ```
    pub fn apply(&self, overrides: &str) -> Result<Script, ParseError> {
        let mut s = self.clone();
        let mut stall_for: Option<Option<Duration>> = None;
        for item in split_top(overrides, ',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| ParseError::new(item, "expected key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "head_delay" => s.head_delay = parse_duration(value)?,
                "ttft" => s.ttft = value.parse()?,
                "tokens" => s.tokens = parse_u32(value)?,
                "gap" => s.gap = value.parse()?,
                "stall_after" => {
                    if is_none(value) {
                        s.stall_after = None;
                    } else {
                        let n = parse_u32(value)?;
                        let pause = s.stall_after.and_then(|(_, p)| p);
                        s.stall_after = Some((n, pause));
                    }
                }
                "stall_for" => {
                    stall_for = Some(if value == "forever" || is_none(value) {
                        None
                    } else {
                        Some(parse_duration(value)?)
                    })
                }
                "keepalive" | "keepalive_every" => {
                    s.keepalive_every = if is_none(value) {
                        None
                    } else {
                        let d = parse_duration(value)?;
                        (!d.is_zero()).then_some(d)
                    }
                }
                "status" => {
                    s.status = if is_none(value) {
                        None
                    } else {
                        let code = parse_u32(value)?;
                        Some(
                            u16::try_from(code)
                                .ok()
                                .and_then(|c| StatusCode::from_u16(c).ok())
                                .ok_or_else(|| ParseError::new(value, "not an HTTP status"))?,
                        )
                    }
                }
                "status_fraction" => s.status_fraction = parse_f64(value)?,
                "retry_after" => {
                    s.retry_after = if is_none(value) {
                        None
                    } else {
                        Some(parse_duration(value)?)
                    }
                }
                "reset" => {
                    s.reset = match value {
                        "before_headers" => Reset::BeforeHeaders,
                        v if is_none(v) => Reset::None,
                        v => Reset::AfterTokens(parse_u32(v)?),
                    }
                }
                "reset_after" | "reset_after_tokens" => {
                    s.reset = Reset::AfterTokens(parse_u32(value)?)
                }
                "error_after" | "error_event_after" => {
                    s.error_event_after = if is_none(value) {
                        None
                    } else {
                        Some(parse_u32(value)?)
                    }
                }
                "single_slot" => s.single_slot = parse_bool(value)?,
                "seed" => {
                    s.seed = value
                        .parse()
                        .map_err(|_| ParseError::new(value, "not an integer"))?
                }
                "early_meta" => s.early_meta = parse_bool(value)?,
                "tool_calls" => s.tool_calls = parse_bool(value)?,
                _ => return Err(ParseError::new(key, "unknown key")),
            }
        }
        if let Some(pause) = stall_for {
            let n = s.stall_after.map(|(n, _)| n).unwrap_or(0);
            s.stall_after = Some((n, pause));
        }
        Ok(s)
    }
}

impl FromStr for Script {
    type Err = ParseError;

    /// [`Script::new`] with the overrides applied.
    fn from_str(s: &str) -> Result<Self, ParseError> {
        Script::new().apply(s)
    }
}

impl fmt::Display for Script {
    /// Every knob in the header syntax: `Script::from_str(&s.to_string()) == s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "head_delay={},ttft={},tokens={},gap={}",
            DurationFmt(self.head_delay),
            self.ttft,
            self.tokens,
            self.gap
        )?;
        match self.stall_after {
            None => f.write_str(",stall_after=none")?,
            Some((n, None)) => write!(f, ",stall_after={n},stall_for=forever")?,
            Some((n, Some(d))) => write!(f, ",stall_after={n},stall_for={}", DurationFmt(d))?,
        }
        match self.keepalive_every {
            None => f.write_str(",keepalive=none")?,
            Some(d) => write!(f, ",keepalive={}", DurationFmt(d))?,
        }
        match self.status {
            None => f.write_str(",status=none")?,
            Some(s) => write!(f, ",status={}", s.as_u16())?,
        }
        write!(f, ",status_fraction={}", self.status_fraction)?;
        match self.retry_after {
            None => f.write_str(",retry_after=none")?,
            Some(d) => write!(f, ",retry_after={}", DurationFmt(d))?,
        }
        match self.reset {
            Reset::None => f.write_str(",reset=none")?,
            Reset::BeforeHeaders => f.write_str(",reset=before_headers")?,
            Reset::AfterTokens(n) => write!(f, ",reset={n}")?,
        }
        match self.error_event_after {
            None => f.write_str(",error_after=none")?,
            Some(n) => write!(f, ",error_after={n}")?,
        }
        write!(
            f,
            ",single_slot={},seed={},early_meta={},tool_calls={}",
            self.single_slot, self.seed, self.early_meta, self.tool_calls
        )
    }
}

/// A script or latency string that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    input: String,
    reason: &'static str,
}

impl ParseError {
    fn new(input: &str, reason: &'static str) -> Self {
        ParseError {
            input: input.to_owned(),
            reason,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid mock script `{}`: {}", self.input, self.reason)
    }
}

impl std::error::Error for ParseError {}

/// Prints a duration in the header syntax, exactly (integer count of the largest unit that
/// divides it).
pub(crate) struct DurationFmt(pub(crate) Duration);

impl fmt::Display for DurationFmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            f.write_str("0ms")
        } else if ns.is_multiple_of(1_000_000_000) {
            write!(f, "{}s", ns / 1_000_000_000)
        } else if ns.is_multiple_of(1_000_000) {
            write!(f, "{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            write!(f, "{}us", ns / 1_000)
        } else {
            write!(f, "{ns}ns")
        }
    }
}

/// Parses `250ms`, `1.5s`, `10us`, `2m`, `1h`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| ParseError::new(s, "a duration needs a unit (ns, us, ms, s, m, h)"))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| ParseError::new(s, "not a number"))?;
    let scale = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(ParseError::new(s, "unknown unit (ns, us, ms, s, m, h)")),
    };
    // Integers are converted exactly; fractions through f64.
    if let Ok(int) = num.parse::<u64>() {
        let d = match unit.trim() {
            "ns" => Some(Duration::from_nanos(int)),
            "us" | "µs" => Some(Duration::from_micros(int)),
            "ms" => Some(Duration::from_millis(int)),
            "s" => Some(Duration::from_secs(int)),
            "h" => int.checked_mul(3600).map(Duration::from_secs),
            _ => int.checked_mul(60).map(Duration::from_secs),
        };
        return d.ok_or_else(|| ParseError::new(s, "too large"));
    }
    Duration::try_from_secs_f64(value * scale).map_err(|_| ParseError::new(s, "out of range"))
}

fn parse_u32(s: &str) -> Result<u32, ParseError> {
    s.trim()
        .parse()
        .map_err(|_| ParseError::new(s, "not a non-negative integer"))
}

fn parse_f64(s: &str) -> Result<f64, ParseError> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| ParseError::new(s, "not a number"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ParseError::new(s, "not a finite number"))
    }
}

fn parse_bool(s: &str) -> Result<bool, ParseError> {
    match s.trim() {
        "true" | "1" | "on" | "yes" => Ok(true),
        "false" | "0" | "off" | "no" => Ok(false),
        _ => Err(ParseError::new(s, "not a bool")),
    }
}

fn is_none(s: &str) -> bool {
    matches!(s, "none" | "off")
}

/// `name(inner)` → `inner`.
fn strip_call<'a>(s: &'a str, name: &str) -> Option<&'a str> {
    s.strip_prefix(name)?
        .trim_start()
        .strip_prefix('(')?
        .strip_suffix(')')
}

/// Splits on `sep` outside parentheses.
fn split_top(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if c == sep && depth == 0 => {
                out.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("12").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("1e400s").is_err());
        assert!(parse_duration("18446744073709551615m").is_err());
    }

    #[test]
    fn full_round_trip() {
        let s = Script::new()
            .head_delay(Duration::from_millis(3))
            .ttft(Latency::log_normal(Duration::from_millis(200), 0.25))
            .tokens(5)
            .gap(Duration::from_micros(1500))
            .stall_after(2, Some(Duration::from_secs(1)))
            .keepalive_every(Duration::from_millis(100))
            .status(StatusCode::TOO_MANY_REQUESTS)
            .status_fraction(0.5)
            .retry_after(Duration::from_secs(2))
            .reset_after_tokens(4)
            .error_event_after(3)
            .single_slot(true)
            .seed(42)
            .early_meta(false)
            .tool_calls(true);
        assert_eq!(s.to_string().parse::<Script>().unwrap(), s);
        assert_eq!(
            Script::new().to_string().parse::<Script>().unwrap(),
            Script::new()
        );
    }

    #[test]
    fn stall_for_alone_means_before_first_token() {
        let s: Script = "stall_for=2s".parse().unwrap();
        assert_eq!(s.stall_after, Some((0, Some(Duration::from_secs(2)))));
        let s: Script = "stall_after=3".parse().unwrap();
        assert_eq!(s.stall_after, Some((3, None)));
    }

    #[test]
    fn errors_are_errors_not_panics() {
        for bad in [
            "ttft",
            "ttft=",
            "nope=1",
            "status=99",
            "status=70000",
            "tokens=-1",
            "ttft=lognormal(1ms)",
            "ttft=lognormal(1ms,-1)",
            "ttft=mix(2,1ms,2ms)",
            "ttft=mix(0.1,1ms,2ms",
            "gap=lognormal(1ms,nan)",
            "single_slot=maybe",
        ] {
            assert!(bad.parse::<Script>().is_err(), "{bad}");
        }
    }

    #[test]
    fn samples_are_seeded_and_capped() {
        let l: Latency = "mix(0.1,lognormal(100ms,0.5),10s)".parse().unwrap();
        let mut a = SplitMix64::new(1);
        let mut b = SplitMix64::new(1);
        let xs: Vec<_> = (0..1000).map(|_| l.sample(&mut a)).collect();
        let ys: Vec<_> = (0..1000).map(|_| l.sample(&mut b)).collect();
        assert_eq!(xs, ys);
        let slow = xs.iter().filter(|d| **d == Duration::from_secs(10)).count();
        assert!((60..=140).contains(&slow), "{slow}");
        let huge = Latency::log_normal(Duration::from_secs(3000), 50.0);
        let mut r = SplitMix64::new(3);
        for _ in 0..100 {
            assert!(huge.sample(&mut r) <= MAX_LATENCY);
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn latency() -> impl Strategy<Value = Latency> {
            let leaf = prop_oneof![
                (0u64..10_000_000).prop_map(|us| Latency::Fixed(Duration::from_micros(us))),
                ((0u64..10_000), 0u32..300).prop_map(|(ms, s)| Latency::log_normal(
                    Duration::from_millis(ms),
                    f64::from(s) / 100.0
                )),
            ];
            leaf.prop_recursive(2, 4, 2, |inner| {
                (inner.clone(), inner, 0u32..=100)
                    .prop_map(|(a, b, f)| Latency::mixture(a, b, f64::from(f) / 100.0))
            })
        }

        fn script() -> impl Strategy<Value = Script> {
            (
                (0u64..100_000, latency(), 0u32..1000, latency()),
                (
                    proptest::option::of((0u32..100, proptest::option::of(0u64..100_000))),
                    proptest::option::of(1u64..100_000),
                    proptest::option::of(prop_oneof![Just(429u16), Just(500), Just(503)]),
                    0u32..=100,
                ),
                (
                    proptest::option::of(0u64..100_000),
                    0u8..3,
                    proptest::option::of(0u32..100),
                    any::<(bool, u64, bool, bool)>(),
                ),
            )
                .prop_map(
                    |(
                        (head, ttft, tokens, gap),
                        (stall, ka, status, frac),
                        (retry, reset, err, (slot, seed, early, tools)),
                    )| {
                        let mut s = Script::new()
                            .head_delay(Duration::from_millis(head))
                            .ttft(ttft)
                            .tokens(tokens)
                            .gap(gap)
                            .status_fraction(f64::from(frac) / 100.0)
                            .single_slot(slot)
                            .seed(seed)
                            .early_meta(early)
                            .tool_calls(tools);
                        if let Some((n, p)) = stall {
                            s = s.stall_after(n, p.map(Duration::from_millis));
                        }
                        if let Some(k) = ka {
                            s = s.keepalive_every(Duration::from_millis(k));
                        }
                        if let Some(st) = status {
                            s = s.status(StatusCode::from_u16(st).unwrap());
                        }
                        if let Some(r) = retry {
                            s = s.retry_after(Duration::from_millis(r));
                        }
                        s = match reset {
                            1 => s.reset_before_headers(),
                            2 => s.reset_after_tokens(tokens / 2),
                            _ => s,
                        };
                        if let Some(e) = err {
                            s = s.error_event_after(e);
                        }
                        s
                    },
                )
        }

        proptest! {
            #[test]
            fn display_parses_back(s in script()) {
                prop_assert_eq!(s.to_string().parse::<Script>().unwrap(), s);
            }

            #[test]
            fn any_input_is_an_error_or_a_script(input in ".{0,80}") {
                let _ = input.parse::<Script>();
                let _ = input.parse::<Latency>();
                let _ = parse_duration(&input);
            }

            #[test]
            fn structured_garbage_never_panics(
                key in prop_oneof![Just("ttft"), Just("gap"), Just("stall_for"), Just("status"),
                    Just("reset"), Just("keepalive"), Just("seed"), Just("tokens")],
                value in "[a-z0-9().,_ ]{0,30}",
            ) {
                let _ = format!("{key}={value}").parse::<Script>();
            }
        }
    }
}
