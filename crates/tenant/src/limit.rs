//! What a budget limits: [`Limit`] (tokens of a [`Kind`] per [`Window`]) and [`Tokens`], the
//! input and output tokens of one request.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// The tokens of one request: its input (the prompt) and its output (the answer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tokens {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
}

impl Tokens {
    /// No tokens.
    pub const ZERO: Tokens = Tokens {
        input: 0,
        output: 0,
    };

    /// `input` input tokens and `output` output tokens.
    pub fn new(input: u64, output: u64) -> Self {
        Tokens { input, output }
    }

    /// Input and output together (saturating).
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// Which tokens a [`Limit`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Input (prompt) tokens.
    Input,
    /// Output (completion) tokens.
    Output,
    /// Input and output tokens together.
    Total,
}

impl Kind {
    /// A bounded label: `"input"`, `"output"` or `"total"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Input => "input",
            Kind::Output => "output",
            Kind::Total => "total",
        }
    }

    /// The tokens of `tokens` this kind counts.
    ///
    /// ```
    /// use tailguard_tenant::{Kind, Tokens};
    ///
    /// let t = Tokens::new(30, 12);
    /// assert_eq!([Kind::Input, Kind::Output, Kind::Total].map(|k| k.of(t)), [30, 12, 42]);
    /// ```
    pub fn of(self, tokens: Tokens) -> u64 {
        match self {
            Kind::Input => tokens.input,
            Kind::Output => tokens.output,
            Kind::Total => tokens.total(),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The period over which a [`Limit`]'s tokens refill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Window {
    /// 60 seconds.
    Minute,
    /// 24 hours.
    Day,
    /// Any period (a zero period is taken as one nanosecond).
    Every(Duration),
}

impl Window {
    /// The period, never zero.
    pub fn duration(self) -> Duration {
        match self {
            Window::Minute => Duration::from_secs(60),
            Window::Day => Duration::from_secs(24 * 60 * 60),
            Window::Every(d) => d.max(Duration::from_nanos(1)),
        }
    }

    /// A bounded label: `"minute"`, `"day"`, or the period (`"3600s"`, `"250ms"`; whole
    /// seconds when it is a whole number of them, else milliseconds, else nanoseconds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tailguard_tenant::Window;
    ///
    /// assert_eq!(Window::Minute.label(), "minute");
    /// assert_eq!(Window::Every(Duration::from_secs(3600)).label(), "3600s");
    /// assert_eq!(Window::Every(Duration::from_millis(250)).label(), "250ms");
    /// ```
    pub fn label(self) -> Cow<'static, str> {
        match self {
            Window::Minute => Cow::Borrowed("minute"),
            Window::Day => Cow::Borrowed("day"),
            Window::Every(_) => {
                let d = self.duration();
                Cow::Owned(if d.subsec_nanos() == 0 {
                    format!("{}s", d.as_secs())
                } else if d.subsec_nanos().is_multiple_of(1_000_000) {
                    format!("{}ms", d.as_millis())
                } else {
                    format!("{}ns", d.as_nanos())
                })
            }
        }
    }

    /// The period in nanoseconds (at least 1).
    pub(crate) fn nanos(self) -> u128 {
        self.duration().as_nanos()
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// A tenant may use `tokens` tokens of a [`Kind`] per [`Window`].
///
/// The budget is a token bucket: it holds at most `tokens` and refills continuously at
/// `tokens` per window, so a limit of 60 output tokens per minute allows a burst of 60, then
/// one per second.
///
/// ```
/// use tailguard_tenant::{Kind, Limit, Window};
///
/// let l = Limit::per_minute(Kind::Output, 60);
/// assert_eq!((l.window(), l.kind(), l.tokens()), (Window::Minute, Kind::Output, 60));
/// assert_eq!(l.to_string(), "60 output tokens per minute");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    window: Window,
    kind: Kind,
    tokens: u64,
}

impl Limit {
    /// `tokens` tokens of `kind` per `window`.
    pub fn new(window: Window, kind: Kind, tokens: u64) -> Self {
        Limit {
            window,
            kind,
            tokens,
        }
    }

    /// `tokens` tokens of `kind` per minute.
    pub fn per_minute(kind: Kind, tokens: u64) -> Self {
        Limit::new(Window::Minute, kind, tokens)
    }

    /// `tokens` tokens of `kind` per day.
    pub fn per_day(kind: Kind, tokens: u64) -> Self {
        Limit::new(Window::Day, kind, tokens)
    }

    /// The refill period.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Which tokens the limit counts.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The tokens per window: the bucket's capacity.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} tokens per {}",
            self.tokens, self.kind, self.window
        )
    }
}
