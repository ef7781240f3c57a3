//! The compact header syntax of [`Script`] (`ttft=200ms,tokens=5`) and its parsers.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::StatusCode;

use crate::script::{Cut, Garbage, Reset, Script};

impl Script {
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
    /// | `prefill_per_token` | duration | [`prefill_per_token`](Self::prefill_per_token) |
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
    /// | `rst` | bool | [`rst`](Self::rst) |
    /// | `half_event` | integer or `none` | [`half_event_after`](Self::half_event_after) |
    /// | `endless_line` | integer or `none` | [`endless_line_after`](Self::endless_line_after) |
    /// | `line_bytes` | integer | [`line_bytes`](Self::line_bytes) |
    /// | `garbage` | `not_json`, `bad_utf8` or `none` | [`garbage`](Self::garbage) |
    /// | `no_done` | bool | [`no_done`](Self::no_done) |
    /// | `interrupt_after` | integer or `none` | [`interrupt_after`](Self::interrupt_after) |
    /// | `junk_before` | integer | [`junk_before`](Self::junk_before) |
    /// | `junk_after` | integer | [`junk_after`](Self::junk_after) |
    /// | `json_reply` | bool | [`json_reply`](Self::json_reply) |
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
            if key == "stall_for" {
                stall_for = Some(if value == "forever" || is_none(value) {
                    None
                } else {
                    Some(parse_duration(value)?)
                });
            } else if !s.set_shape(key, value)? && !s.set_fault(key, value)? {
                return Err(ParseError::new(key, "unknown key"));
            }
        }
        if let Some(pause) = stall_for {
            let n = s.stall_after.map(|(n, _)| n).unwrap_or(0);
            s.stall_after = Some((n, pause));
        }
        Ok(s)
    }

    /// Sets a key of the stream's shape and timing; `false` if `key` is not one.
    fn set_shape(&mut self, key: &str, value: &str) -> Result<bool, ParseError> {
        match key {
            "head_delay" => self.head_delay = parse_duration(value)?,
            "ttft" => self.ttft = value.parse()?,
            "tokens" => self.tokens = parse_u32(value)?,
            "gap" => self.gap = value.parse()?,
            "prefill_per_token" => self.prefill_per_token = parse_duration(value)?,
            "stall_after" => {
                self.stall_after = if is_none(value) {
                    None
                } else {
                    let pause = self.stall_after.and_then(|(_, p)| p);
                    Some((parse_u32(value)?, pause))
                }
            }
            "keepalive" | "keepalive_every" => {
                self.keepalive_every = match opt_value(value, parse_duration)? {
                    Some(d) if !d.is_zero() => Some(d),
                    _ => None,
                }
            }
            "single_slot" => self.single_slot = parse_bool(value)?,
            "seed" => {
                self.seed = value
                    .parse()
                    .map_err(|_| ParseError::new(value, "not an integer"))?
            }
            "early_meta" => self.early_meta = parse_bool(value)?,
            "tool_calls" => self.tool_calls = parse_bool(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Sets a key of the scripted faults; `false` if `key` is not one.
    fn set_fault(&mut self, key: &str, value: &str) -> Result<bool, ParseError> {
        match key {
            "status" => self.status = opt_value(value, parse_status)?,
            "status_fraction" => self.status_fraction = parse_f64(value)?,
            "retry_after" => self.retry_after = opt_value(value, parse_duration)?,
            "reset" => {
                self.reset = match value {
                    "before_headers" => Reset::BeforeHeaders,
                    v if is_none(v) => Reset::None,
                    v => Reset::AfterTokens(parse_u32(v)?),
                }
            }
            "reset_after" | "reset_after_tokens" => {
                self.reset = Reset::AfterTokens(parse_u32(value)?)
            }
            "error_after" | "error_event_after" => {
                self.error_event_after = opt_value(value, parse_u32)?
            }
            "rst" => self.rst = parse_bool(value)?,
            "half_event" => self.cut = opt_value(value, parse_u32)?.map(|n| (n, Cut::HalfEvent)),
            "endless_line" => {
                self.cut = opt_value(value, parse_u32)?.map(|n| (n, Cut::EndlessLine))
            }
            "line_bytes" => {
                self.line_bytes = value
                    .parse()
                    .map_err(|_| ParseError::new(value, "not a byte count"))?
            }
            "garbage" => {
                self.garbage = match value {
                    "not_json" => Some(Garbage::NotJson),
                    "bad_utf8" => Some(Garbage::BadUtf8),
                    v if is_none(v) => None,
                    _ => return Err(ParseError::new(value, "not_json, bad_utf8 or none")),
                }
            }
            "no_done" => self.no_done = parse_bool(value)?,
            "interrupt_after" => self.interrupt_after = opt_value(value, parse_u32)?,
            "junk_before" => self.junk_before = parse_u32(value)?,
            "junk_after" => self.junk_after = parse_u32(value)?,
            "json_reply" => self.json_reply = parse_bool(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `none`/`off`, or a value.
fn opt_value<T>(
    value: &str,
    parse: impl Fn(&str) -> Result<T, ParseError>,
) -> Result<Option<T>, ParseError> {
    if is_none(value) {
        Ok(None)
    } else {
        parse(value).map(Some)
    }
}

fn parse_status(value: &str) -> Result<StatusCode, ParseError> {
    u16::try_from(parse_u32(value)?)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| ParseError::new(value, "not an HTTP status"))
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
            "head_delay={},ttft={},tokens={},gap={},prefill_per_token={}",
            DurationFmt(self.head_delay),
            self.ttft,
            self.tokens,
            self.gap,
            DurationFmt(self.prefill_per_token)
        )?;
        match self.stall_after {
            None => f.write_str(",stall_after=none")?,
            Some((n, None)) => write!(f, ",stall_after={n},stall_for=forever")?,
            Some((n, Some(d))) => write!(f, ",stall_after={n},stall_for={}", DurationFmt(d))?,
        }
        opt(f, "keepalive", self.keepalive_every.map(DurationFmt))?;
        opt(f, "status", self.status.map(|s| s.as_u16()))?;
        write!(f, ",status_fraction={}", self.status_fraction)?;
        opt(f, "retry_after", self.retry_after.map(DurationFmt))?;
        match self.reset {
            Reset::None => f.write_str(",reset=none")?,
            Reset::BeforeHeaders => f.write_str(",reset=before_headers")?,
            Reset::AfterTokens(n) => write!(f, ",reset={n}")?,
        }
        opt(f, "error_after", self.error_event_after)?;
        write!(
            f,
            ",single_slot={},seed={},early_meta={},tool_calls={},rst={}",
            self.single_slot, self.seed, self.early_meta, self.tool_calls, self.rst
        )?;
        match self.cut {
            None => f.write_str(",half_event=none")?,
            Some((n, Cut::HalfEvent)) => write!(f, ",half_event={n}")?,
            Some((n, Cut::EndlessLine)) => write!(f, ",endless_line={n}")?,
        }
        write!(f, ",line_bytes={}", self.line_bytes)?;
        opt(f, "garbage", self.garbage.map(garbage_name))?;
        opt(f, "interrupt_after", self.interrupt_after)?;
        write!(
            f,
            ",no_done={},junk_before={},junk_after={},json_reply={}",
            self.no_done, self.junk_before, self.junk_after, self.json_reply
        )
    }
}

/// `,key=value`, or `,key=none`.
fn opt<T: fmt::Display>(f: &mut fmt::Formatter<'_>, key: &str, v: Option<T>) -> fmt::Result {
    match v {
        None => write!(f, ",{key}=none"),
        Some(v) => write!(f, ",{key}={v}"),
    }
}

fn garbage_name(g: Garbage) -> &'static str {
    match g {
        Garbage::NotJson => "not_json",
        Garbage::BadUtf8 => "bad_utf8",
    }
}

/// A script or latency string that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    input: String,
    reason: &'static str,
}

impl ParseError {
    pub(crate) fn new(input: &str, reason: &'static str) -> Self {
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

pub(crate) fn parse_f64(s: &str) -> Result<f64, ParseError> {
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
pub(crate) fn strip_call<'a>(s: &'a str, name: &str) -> Option<&'a str> {
    s.strip_prefix(name)?
        .trim_start()
        .strip_prefix('(')?
        .strip_suffix(')')
}

/// Splits on `sep` outside parentheses.
pub(crate) fn split_top(s: &str, sep: char) -> Vec<&str> {
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
    use crate::latency::Latency;

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
            .tool_calls(true)
            .rst(true)
            .endless_line_after(2)
            .line_bytes(4096)
            .garbage(Garbage::BadUtf8)
            .no_done(true)
            .interrupt_after(4)
            .junk_before(2)
            .junk_after(3)
            .json_reply(true);
        assert_eq!(s.to_string().parse::<Script>().unwrap(), s);
        let half = Script::new().half_event_after(0).garbage(Garbage::NotJson);
        assert_eq!(half.to_string().parse::<Script>().unwrap(), half);
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
            "half_event=-1",
            "endless_line=x",
            "line_bytes=1MiB",
            "garbage=some",
            "rst=2",
            "interrupt_after=-1",
        ] {
            assert!(bad.parse::<Script>().is_err(), "{bad}");
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
                (
                    any::<bool>(),
                    proptest::option::of((0u32..100, any::<bool>())),
                    0u64..10_000_000,
                    proptest::option::of(any::<bool>()),
                    any::<bool>(),
                ),
            )
                .prop_map(
                    |(
                        (head, ttft, tokens, gap),
                        (stall, ka, status, frac),
                        (retry, reset, err, (slot, seed, early, tools)),
                        (rst, cut, line, garbage, no_done),
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
                            .tool_calls(tools)
                            .rst(rst)
                            .line_bytes(line)
                            .no_done(no_done);
                        s = match cut {
                            Some((n, true)) => s.half_event_after(n),
                            Some((n, false)) => s.endless_line_after(n),
                            None => s,
                        };
                        if let Some(g) = garbage {
                            s = s.garbage(if g {
                                Garbage::NotJson
                            } else {
                                Garbage::BadUtf8
                            });
                        }
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

            /// Any input is a script that prints back to itself, or an error that says what
            /// is wrong; never a panic.
            #[test]
            fn any_input_is_an_error_or_a_script(input in ".{0,80}") {
                match input.parse::<Script>() {
                    Ok(s) => prop_assert_eq!(s.to_string().parse::<Script>().unwrap(), s),
                    Err(e) => prop_assert!(!e.to_string().is_empty()),
                }
                if let Ok(l) = input.parse::<Latency>() {
                    let back = format!("ttft={l}").parse::<Script>().unwrap();
                    prop_assert_eq!(back.ttft, l);
                }
                if let Ok(d) = parse_duration(&input) {
                    prop_assert_eq!(parse_duration(&DurationFmt(d).to_string()).unwrap(), d);
                }
            }

            /// A known key with a garbage value parses to a script that prints back to itself,
            /// or is refused with an error that quotes the part it could not read.
            #[test]
            fn structured_garbage_is_a_script_or_a_quoted_error(
                key in prop_oneof![Just("ttft"), Just("gap"), Just("stall_for"), Just("status"),
                    Just("reset"), Just("keepalive"), Just("seed"), Just("tokens")],
                value in "[a-z0-9().,_ ]{0,30}",
            ) {
                let input = format!("{key}={value}");
                match input.parse::<Script>() {
                    Ok(s) => prop_assert_eq!(s.to_string().parse::<Script>().unwrap(), s),
                    Err(e) => prop_assert!(!e.to_string().is_empty(), "{input}"),
                }
            }
        }
    }
}
