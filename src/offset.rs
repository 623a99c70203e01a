//! [`WindowOffset`]: clock-aligned windows that follow a time zone's clock.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::quota::{ParseError, ParseErrorKind};

/// The UTC offset of the time zone whose clock a rule's clock-aligned windows follow: with `+8h` a
/// `1/day` window resets at midnight in UTC+8 (16:00 UTC), with `-5h` at 05:00 UTC, with `30m` an
/// hourly window resets at half past every UTC hour. Applied modulo each quota's period, to the
/// [`FixedWindow`](crate::Strategy::FixedWindow) and
/// [`SlidingWindow`](crate::Strategy::SlidingWindow) strategies (the others have no clock-aligned
/// edges). A fixed offset: daylight-saving rules and zone names are out of scope.
///
/// Notation: `[+-]HH:MM`, or an optional sign followed by `Nh`, `Nm` or `NhMm`; below 24 hours.
///
/// ```
/// use tollgate::WindowOffset;
///
/// let east: WindowOffset = "+08:00".parse().unwrap();
/// assert_eq!(east, "8h".parse().unwrap());
/// assert_eq!(east.seconds(), 8 * 3600);
/// assert_eq!("-5h30m".parse::<WindowOffset>().unwrap().seconds(), -(5 * 3600 + 30 * 60));
/// assert_eq!("30m".parse::<WindowOffset>().unwrap().to_string(), "+00:30");
/// assert!("24h".parse::<WindowOffset>().is_err());
/// assert!("8".parse::<WindowOffset>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowOffset {
    minutes: i32,
}

/// The largest offset, in minutes (23:59).
const MAX_MINUTES: i32 = 24 * 60 - 1;

impl WindowOffset {
    /// No offset: windows follow UTC.
    pub const UTC: WindowOffset = WindowOffset { minutes: 0 };

    /// An offset of `minutes` (east of UTC positive).
    ///
    /// # Errors
    /// [`ParseError`] ([`ParseErrorKind::OffsetTooLarge`]) when `|minutes|` is 24 hours or more.
    pub fn from_minutes(minutes: i32) -> Result<Self, ParseError> {
        if minutes.unsigned_abs() > MAX_MINUTES.unsigned_abs() {
            return Err(too_large(&minutes.to_string()));
        }
        Ok(Self { minutes })
    }

    /// The offset in seconds (east of UTC positive).
    pub const fn seconds(&self) -> i64 {
        self.minutes as i64 * 60
    }

    /// The offset in minutes (east of UTC positive).
    pub const fn minutes(&self) -> i32 {
        self.minutes
    }

    /// `true` for UTC.
    pub const fn is_utc(&self) -> bool {
        self.minutes == 0
    }

    /// Where a window of `period` ticks starts, as a phase in `0..period`: windows start at the
    /// times `t` with `(t + phase) % period == 0`. `tick` is the store's unit.
    pub(crate) fn phase(&self, period: u64, tick: Duration) -> u64 {
        if period == 0 {
            return 0;
        }
        let tick = tick.as_nanos().max(1);
        let ticks = i128::from(self.seconds()) * 1_000_000_000 / i128::try_from(tick).unwrap_or(1);
        u64::try_from(ticks.rem_euclid(i128::from(period))).unwrap_or(0)
    }
}

impl fmt::Display for WindowOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.minutes < 0 { '-' } else { '+' };
        let m = self.minutes.unsigned_abs();
        write!(f, "{sign}{:02}:{:02}", m / 60, m % 60)
    }
}

/// The error of an offset of 24 hours or more, written `input`.
fn too_large(input: &str) -> ParseError {
    ParseError::offset(input, ParseErrorKind::OffsetTooLarge, "24 hours or more")
}

impl FromStr for WindowOffset {
    type Err = ParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |note| ParseError::offset(input, ParseErrorKind::InvalidOffset, note);
        let s = input.trim();
        let (negative, body) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            Some(_) => (false, s),
            None => return Err(err("empty")),
        };
        let number = |digits: &str| -> Result<u32, ParseError> {
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4
            {
                return Err(err("not a number"));
            }
            digits.parse().map_err(|_| err("not a number"))
        };
        let minutes = if let Some((h, m)) = body.split_once(':') {
            if h.len() != 2 || m.len() != 2 {
                return Err(err("HH:MM takes two digits each"));
            }
            let (h, m) = (number(h)?, number(m)?);
            if m >= 60 {
                return Err(err("minutes above 59"));
            }
            h * 60 + m
        } else if let Some(rest) = body.strip_suffix('m') {
            match rest.split_once('h') {
                Some((h, m)) => {
                    let (h, m) = (number(h)?, number(m)?);
                    if m >= 60 {
                        return Err(err("minutes above 59"));
                    }
                    h * 60 + m
                }
                None => number(rest)?,
            }
        } else if let Some(h) = body.strip_suffix('h') {
            number(h)?.saturating_mul(60)
        } else {
            return Err(err("no unit"));
        };
        let minutes = i32::try_from(minutes).map_err(|_| too_large(input))?;
        if minutes > MAX_MINUTES {
            return Err(too_large(input));
        }
        Ok(Self {
            minutes: if negative { -minutes } else { minutes },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notation() {
        for (text, minutes) in [
            ("+08:00", 480),
            ("-05:00", -300),
            ("00:30", 30),
            ("8h", 480),
            ("+8h", 480),
            ("-5h", -300),
            ("30m", 30),
            ("-90m", -90),
            ("5h30m", 330),
            ("-3h30m", -210),
            ("23h59m", 1439),
            ("0h", 0),
        ] {
            assert_eq!(
                text.parse::<WindowOffset>().map(|o| o.minutes()),
                Ok(minutes),
                "{text}"
            );
        }
        for bad in [
            "", "8", "+", "24h", "1440m", "-24:00", "8:00", "08:60", "5h60m", "h", "m", "x8h",
            "8hm", "++8h", "8 h", "99999h",
        ] {
            assert!(bad.parse::<WindowOffset>().is_err(), "{bad:?}");
        }
        assert_eq!(
            WindowOffset::from_minutes(-210).unwrap().to_string(),
            "-03:30"
        );
        assert!(WindowOffset::from_minutes(1440).is_err());
    }

    #[test]
    fn phase_is_the_offset_modulo_the_period() {
        let ns = Duration::from_nanos(1);
        let hour = 3_600_000_000_000;
        let day = 24 * hour;
        let at = |s: &str| s.parse::<WindowOffset>().unwrap();
        assert_eq!(at("8h").phase(day, ns), 8 * hour);
        assert_eq!(at("-5h").phase(day, ns), 19 * hour, "05:00 UTC");
        assert_eq!(at("30m").phase(hour, ns), hour / 2);
        assert_eq!(at("-5h").phase(7 * hour, ns), 2 * hour, "modulo the period");
        assert_eq!(
            at("8h").phase(day / 1000, Duration::from_micros(1)),
            8 * hour / 1000 % (day / 1000)
        );
        assert_eq!(WindowOffset::UTC.phase(day, ns), 0);
    }
}
