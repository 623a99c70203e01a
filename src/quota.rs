//! Quotas ("10 requests per minute") and their text notation.
//!
//! A [`Quota`] is a limit `N` over a period `W`, with an optional burst for the bucket strategies.
//! The notation accepted by [`Quota::from_str`](std::str::FromStr) and [`parse_quotas`]:
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Quota, parse_quotas};
//!
//! let q: Quota = "10/minute".parse().unwrap();
//! assert_eq!((q.limit(), q.period()), (10, Duration::from_secs(60)));
//! assert_eq!("100/30s".parse::<Quota>().unwrap().period(), Duration::from_secs(30));
//! assert_eq!("10 per minute".parse::<Quota>().unwrap(), q);
//!
//! let several = parse_quotas("2/second; 100/minute").unwrap();
//! assert_eq!(several.len(), 2);
//!
//! let err = "10/fortnight".parse::<Quota>().unwrap_err();
//! assert_eq!(err.to_string(), "invalid quota \"10/fortnight\" at byte 3: unknown unit \"fortnight\" (expected ns, us, ms, s, m, h or d)");
//! ```

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

/// The longest period a quota may have ([`Quota::MAX_PERIOD`]).
pub(crate) const MAX_PERIOD: Duration = Duration::from_secs(3660 * 24 * 3600);

/// A limit of `N` requests (or units of cost) per period `W`, with an optional burst.
///
/// The burst only matters for the token bucket and the leaky bucket (their capacity `B`); it defaults
/// to the limit. Build one with the `per_*` constructors, [`Quota::new`], or parse the notation.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::Quota;
///
/// let q = Quota::per_second(NonZeroU32::new(100).unwrap()).with_burst(NonZeroU32::new(500).unwrap());
/// assert_eq!((q.limit(), q.burst()), (100, 500));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: NonZeroU32,
    period: Duration,
    burst: Option<NonZeroU32>,
}

impl Quota {
    /// The longest period a quota may have: ten years of 366 days.
    ///
    /// Longer periods are refused so that every time sum the strategies and the Redis scripts
    /// compute (now + 2 periods, in microseconds, as a Lua double) stays exact.
    pub const MAX_PERIOD: Duration = MAX_PERIOD;

    /// `limit` per `period`.
    ///
    /// # Errors
    /// [`QuotaError`] when the period is zero or longer than [`Quota::MAX_PERIOD`].
    pub const fn new(limit: NonZeroU32, period: Duration) -> Result<Self, QuotaError> {
        if period.is_zero() {
            return Err(QuotaError::ZeroPeriod);
        }
        if period.as_nanos() > MAX_PERIOD.as_nanos() {
            return Err(QuotaError::PeriodTooLong);
        }
        Ok(Self {
            limit,
            period,
            burst: None,
        })
    }

    /// `limit` per second.
    pub const fn per_second(limit: NonZeroU32) -> Self {
        Self::fixed(limit, 1)
    }

    /// `limit` per minute.
    pub const fn per_minute(limit: NonZeroU32) -> Self {
        Self::fixed(limit, 60)
    }

    /// `limit` per hour.
    pub const fn per_hour(limit: NonZeroU32) -> Self {
        Self::fixed(limit, 3600)
    }

    /// `limit` per day.
    pub const fn per_day(limit: NonZeroU32) -> Self {
        Self::fixed(limit, 86_400)
    }

    const fn fixed(limit: NonZeroU32, secs: u64) -> Self {
        Self {
            limit,
            period: Duration::from_secs(secs),
            burst: None,
        }
    }

    /// Sets the burst (capacity) used by the token bucket and the leaky bucket.
    #[must_use]
    pub const fn with_burst(mut self, burst: NonZeroU32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The limit `N`.
    pub const fn limit(&self) -> u32 {
        self.limit.get()
    }

    /// The period `W`.
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The burst `B` of the bucket strategies: the configured one, else the limit.
    pub const fn burst(&self) -> u32 {
        match self.burst {
            Some(b) => b.get(),
            None => self.limit.get(),
        }
    }

    /// Whether a burst was set explicitly.
    pub const fn has_explicit_burst(&self) -> bool {
        self.burst.is_some()
    }

    /// The period in nanoseconds (fits in a `u64`: at most [`Quota::MAX_PERIOD`]).
    pub(crate) const fn period_nanos(&self) -> u64 {
        self.period.as_nanos() as u64
    }
}

/// Why a quota cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The period is zero.
    ZeroPeriod,
    /// The period is longer than [`Quota::MAX_PERIOD`].
    PeriodTooLong,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroPeriod => f.write_str("the period must not be zero"),
            Self::PeriodTooLong => write!(
                f,
                "the period must be at most {} days",
                MAX_PERIOD.as_secs() / 86_400
            ),
        }
    }
}

impl std::error::Error for QuotaError {}

/// Configuration text that did not parse: a quota (`"10/minute"`), a strategy's name
/// (`"token-bucket"`), a window offset (`"+08:00"`) or a CIDR range (`"10.0.0.0/8"`). It gives the
/// input, the byte offset of the problem, and what is wrong ([`kind`](Self::kind)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    input: String,
    position: usize,
    kind: ParseErrorKind,
    /// More about a window offset's notation, for the message.
    note: &'static str,
}

/// What is wrong with configuration text ([`ParseError`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// A quota: nothing to parse.
    Empty,
    /// A quota: the limit is not a whole number.
    InvalidLimit,
    /// A quota: the limit is zero.
    ZeroLimit,
    /// A quota: the limit is larger than `u32::MAX`.
    LimitTooLarge,
    /// A quota: no `/` or `per` between the limit and the period.
    MissingSeparator,
    /// A quota: the period has no unit.
    MissingUnit,
    /// A quota: the unit is not one of the known ones.
    UnknownUnit(String),
    /// A quota: the number before the unit is not a whole number.
    InvalidPeriodCount,
    /// A quota: the period is zero.
    ZeroPeriod,
    /// A quota: the period is longer than [`Quota::MAX_PERIOD`].
    PeriodTooLong,
    /// Not the name of a [`Strategy`](crate::Strategy) (see [`Strategy::ALL`](crate::Strategy::ALL)).
    UnknownStrategy,
    /// A window offset not written `[+-]HH:MM`, or `[+-]` followed by `Nh`, `Nm` or `NhMm`.
    InvalidOffset,
    /// A window offset of 24 hours or more.
    OffsetTooLarge,
    /// Not a CIDR range: `ADDRESS` or `ADDRESS/PREFIX`, the prefix at most the address's width
    /// (32 or 128).
    InvalidCidr,
}

impl ParseError {
    pub(crate) fn new(input: &str, position: usize, kind: ParseErrorKind) -> Self {
        Self {
            input: input.to_owned(),
            position,
            kind,
            note: "",
        }
    }

    /// A window offset's error of `kind` on `input`, `note` saying more.
    pub(crate) fn offset(input: &str, kind: ParseErrorKind, note: &'static str) -> Self {
        Self {
            note,
            ..Self::new(input, 0, kind)
        }
    }

    /// The text that failed to parse.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// The byte offset in [`input`](Self::input) where the problem is (0 for a strategy, a
    /// window offset or a CIDR range: the whole input).
    pub fn position(&self) -> usize {
        self.position
    }

    /// What is wrong.
    pub fn kind(&self) -> &ParseErrorKind {
        &self.kind
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let input = &self.input;
        let quota = |f: &mut fmt::Formatter<'_>, what: fmt::Arguments<'_>| {
            write!(
                f,
                "invalid quota {input:?} at byte {}: {what}",
                self.position
            )
        };
        match &self.kind {
            ParseErrorKind::Empty => {
                quota(f, format_args!("empty quota (expected e.g. \"10/minute\")"))
            }
            ParseErrorKind::InvalidLimit => {
                quota(f, format_args!("the limit must be a whole number"))
            }
            ParseErrorKind::ZeroLimit => quota(f, format_args!("the limit must not be zero")),
            ParseErrorKind::LimitTooLarge => {
                quota(f, format_args!("the limit must be at most {}", u32::MAX))
            }
            ParseErrorKind::MissingSeparator => {
                quota(f, format_args!("expected \"/\" or \"per\" after the limit"))
            }
            ParseErrorKind::MissingUnit => quota(
                f,
                format_args!("the period needs a unit (ms, s, m, h or d)"),
            ),
            ParseErrorKind::UnknownUnit(u) => quota(
                f,
                format_args!("unknown unit {u:?} (expected ns, us, ms, s, m, h or d)"),
            ),
            ParseErrorKind::InvalidPeriodCount => {
                quota(f, format_args!("the period count must be a whole number"))
            }
            ParseErrorKind::ZeroPeriod => quota(f, format_args!("the period must not be zero")),
            ParseErrorKind::PeriodTooLong => quota(
                f,
                format_args!(
                    "the period must be at most {} days",
                    MAX_PERIOD.as_secs() / 86_400
                ),
            ),
            ParseErrorKind::UnknownStrategy => {
                write!(f, "unknown strategy {input:?} (expected one of")?;
                for s in crate::Strategy::ALL {
                    write!(f, " {s}")?;
                }
                f.write_str(")")
            }
            ParseErrorKind::InvalidOffset | ParseErrorKind::OffsetTooLarge => write!(
                f,
                "invalid window offset {input:?}: {} (expected [+-]HH:MM, or [+-] followed by \
                 Nh, Nm or NhMm, under 24 hours)",
                self.note
            ),
            ParseErrorKind::InvalidCidr => write!(
                f,
                "invalid CIDR range {input:?} (expected ADDRESS or ADDRESS/PREFIX)"
            ),
        }
    }
}

impl std::error::Error for ParseError {}

impl FromStr for Quota {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_one(s, s, 0)
    }
}

/// Parses several quotas separated by `;` or `,` (`"5/second; 100/minute"`): all of them must admit
/// a request. Empty items (a trailing `;`) are ignored, but at least one quota is required.
///
/// # Errors
/// [`ParseError`] for the first item that does not parse, with its position in the whole input.
pub fn parse_quotas(s: &str) -> Result<Vec<Quota>, ParseError> {
    let mut quotas = Vec::new();
    let mut offset = 0;
    for part in s.split([';', ',']) {
        if !part.trim().is_empty() {
            quotas.push(parse_one(s, part, offset)?);
        }
        offset += part.len() + 1;
    }
    if quotas.is_empty() {
        return Err(ParseError::new(s, 0, ParseErrorKind::Empty));
    }
    Ok(quotas)
}

/// Parses one quota `part` that starts at byte `offset` of `whole` (for error positions).
fn parse_one(whole: &str, part: &str, offset: usize) -> Result<Quota, ParseError> {
    let err = |at: usize, kind| ParseError::new(whole, offset + at, kind);
    let lead = part.len() - part.trim_start().len();
    let body = part.trim();
    if body.is_empty() {
        return Err(err(0, ParseErrorKind::Empty));
    }
    let digits = body
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(body.len());
    if digits == 0 {
        return Err(err(lead, ParseErrorKind::InvalidLimit));
    }
    let limit = parse_limit(&body[..digits]).map_err(|k| err(lead, k))?;

    let rest = &body[digits..];
    let rest_at = lead + digits;
    let trimmed = rest.trim_start();
    let sep_at = rest_at + (rest.len() - trimmed.len());
    let after_sep = if let Some(r) = trimmed.strip_prefix('/') {
        r
    } else if let Some(r) = strip_prefix_ignore_case(trimmed, "per") {
        // "per" must be a word of its own: "10 perminute" is not accepted.
        if !r.starts_with(char::is_whitespace) {
            return Err(err(sep_at, ParseErrorKind::MissingSeparator));
        }
        r
    } else {
        return Err(err(sep_at, ParseErrorKind::MissingSeparator));
    };
    let period_text = after_sep.trim();
    let period_at = sep_at
        + (trimmed.len() - after_sep.len())
        + (after_sep.len() - after_sep.trim_start().len());
    let period = parse_period(period_text).map_err(|(at, k)| err(period_at + at, k))?;
    Quota::new(limit, period).map_err(|e| {
        err(
            period_at,
            match e {
                QuotaError::ZeroPeriod => ParseErrorKind::ZeroPeriod,
                QuotaError::PeriodTooLong => ParseErrorKind::PeriodTooLong,
            },
        )
    })
}

fn parse_limit(digits: &str) -> Result<NonZeroU32, ParseErrorKind> {
    let value: u64 = match digits.parse() {
        Ok(v) => v,
        Err(_) => return Err(ParseErrorKind::LimitTooLarge),
    };
    let value = u32::try_from(value).map_err(|_| ParseErrorKind::LimitTooLarge)?;
    NonZeroU32::new(value).ok_or(ParseErrorKind::ZeroLimit)
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// Parses `"minute"`, `"30s"`, `"1h"`, `"30 seconds"`; positions are relative to `text`.
fn parse_period(text: &str) -> Result<Duration, (usize, ParseErrorKind)> {
    if text.is_empty() {
        return Err((0, ParseErrorKind::MissingUnit));
    }
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let count: u64 = if digits == 0 {
        1
    } else {
        text[..digits]
            .parse()
            .map_err(|_| (0, ParseErrorKind::PeriodTooLong))?
    };
    let unit_text = text[digits..].trim_start();
    let unit_at = text.len() - unit_text.len();
    if unit_text.is_empty() {
        return Err((unit_at, ParseErrorKind::MissingUnit));
    }
    let nanos_per_unit = unit_nanos(unit_text)
        .ok_or_else(|| (unit_at, ParseErrorKind::UnknownUnit(unit_text.to_owned())))?;
    if count == 0 {
        return Err((0, ParseErrorKind::ZeroPeriod));
    }
    let nanos = count
        .checked_mul(nanos_per_unit)
        .ok_or((0, ParseErrorKind::PeriodTooLong))?;
    Ok(Duration::from_nanos(nanos))
}

fn unit_nanos(unit: &str) -> Option<u64> {
    const UNITS: &[(&[&str], u64)] = &[
        (&["ns", "nanosecond", "nanoseconds"], 1),
        (&["us", "µs", "microsecond", "microseconds"], 1_000),
        (
            &["ms", "msec", "msecs", "millisecond", "milliseconds"],
            1_000_000,
        ),
        (&["s", "sec", "secs", "second", "seconds"], 1_000_000_000),
        (&["m", "min", "mins", "minute", "minutes"], 60_000_000_000),
        (&["h", "hr", "hrs", "hour", "hours"], 3_600_000_000_000),
        (&["d", "day", "days"], 86_400_000_000_000),
    ];
    UNITS
        .iter()
        .find(|(names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(unit)))
        .map(|&(_, nanos)| nanos)
}

impl fmt::Display for Quota {
    /// Writes the notation that parses back to the same limit and period (`10/minute`, `100/30s`).
    /// The burst has no notation and is not written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMED: &[(u64, &str, &str)] = &[
            (86_400_000_000_000, "day", "d"),
            (3_600_000_000_000, "hour", "h"),
            (60_000_000_000, "minute", "m"),
            (1_000_000_000, "second", "s"),
            (1_000_000, "ms", "ms"),
            (1_000, "us", "us"),
            (1, "ns", "ns"),
        ];
        let nanos = self.period_nanos();
        for &(unit, word, short) in NAMED {
            if nanos % unit == 0 {
                let count = nanos / unit;
                return if count == 1 {
                    write!(f, "{}/{word}", self.limit)
                } else {
                    write!(f, "{}/{count}{short}", self.limit)
                };
            }
        }
        write!(f, "{}/{nanos}ns", self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quota {
        s.parse().unwrap()
    }

    #[test]
    fn parses_the_forms_people_write() {
        let minute = Duration::from_secs(60);
        for s in [
            "10/minute",
            "10/min",
            "10 per minute",
            "10/m",
            "10 / minutes",
            "10 PER Minute",
            "10/1m",
            "10/60s",
        ] {
            assert_eq!(
                q(s),
                Quota::new(NonZeroU32::new(10).unwrap(), minute).unwrap(),
                "{s}"
            );
        }
        assert_eq!(q("100/30s").period(), Duration::from_secs(30));
        assert_eq!(q("5/1h").period(), Duration::from_secs(3600));
        assert_eq!(q("5/2 hours").period(), Duration::from_secs(7200));
        assert_eq!(q("7/250ms").period(), Duration::from_millis(250));
        assert_eq!(q("1/day").period(), Duration::from_secs(86_400));
        assert_eq!(q("4294967295/ms").limit(), u32::MAX);
        assert_eq!(q("1/366d").period(), Duration::from_secs(366 * 86_400));
    }

    #[test]
    fn parses_several_quotas() {
        let all = parse_quotas("2/second; 100/minute").unwrap();
        assert_eq!(all, vec![q("2/s"), q("100/min")]);
        assert_eq!(parse_quotas("2/s,100/min;").unwrap().len(), 2);
    }

    #[test]
    fn rejects_bad_text_with_kind_and_position() {
        let cases: &[(&str, ParseErrorKind, usize)] = &[
            ("", ParseErrorKind::Empty, 0),
            ("   ", ParseErrorKind::Empty, 0),
            ("ten/minute", ParseErrorKind::InvalidLimit, 0),
            ("0/minute", ParseErrorKind::ZeroLimit, 0),
            ("4294967296/s", ParseErrorKind::LimitTooLarge, 0),
            (
                "99999999999999999999999/s",
                ParseErrorKind::LimitTooLarge,
                0,
            ),
            ("10 minute", ParseErrorKind::MissingSeparator, 3),
            ("10 perminute", ParseErrorKind::MissingSeparator, 3),
            ("10/", ParseErrorKind::MissingUnit, 3),
            ("10/30", ParseErrorKind::MissingUnit, 5),
            (
                "10/fortnight",
                ParseErrorKind::UnknownUnit("fortnight".into()),
                3,
            ),
            ("10/0s", ParseErrorKind::ZeroPeriod, 3),
            ("10/3661d", ParseErrorKind::PeriodTooLong, 3),
            ("10/99999999999999999999d", ParseErrorKind::PeriodTooLong, 3),
            ("-1/s", ParseErrorKind::InvalidLimit, 0),
        ];
        for (text, kind, at) in cases {
            let e = text.parse::<Quota>().unwrap_err();
            assert_eq!((e.kind(), e.position()), (kind, *at), "{text}: {e}");
        }
        let e = parse_quotas("5/s; 10/fortnight").unwrap_err();
        assert_eq!(e.position(), 8, "{e}");
        assert!(parse_quotas(" ; ").is_err());
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "10/minute",
            "100/30s",
            "5/hour",
            "1/366d",
            "7/250ms",
            "3/1500us",
            "9/7ns",
            "2/90m",
        ] {
            let a = q(s);
            assert_eq!(q(&a.to_string()), a, "{s} -> {a}");
        }
        assert_eq!(q("10/60s").to_string(), "10/minute");
    }

    #[test]
    fn burst_defaults_to_limit() {
        let a = q("10/s");
        assert_eq!(a.burst(), 10);
        assert_eq!(a.with_burst(NonZeroU32::new(3).unwrap()).burst(), 3);
        assert_eq!(
            Quota::new(NonZeroU32::MIN, Duration::ZERO),
            Err(QuotaError::ZeroPeriod)
        );
    }
}
