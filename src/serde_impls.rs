//! `Serialize`/`Deserialize` on the configuration types (feature `serde`), each reading back what
//! it writes as an equal value:
//!
//! - a [`Quota`] as its text notation (`"10/minute"`), or `{ quota = "10/minute", burst = 50 }`
//!   when its burst was set (the notation has none);
//! - a [`Strategy`] by its command-line name (`"token-bucket"`);
//! - a [`WindowOffset`] as `"+08:00"` (read in any of its notations);
//! - a [`Rule`] as `{ strategy, quotas, window_offset }`: the quotas as one `;`-separated string,
//!   or a list of quotas when one has a burst; the offset only when it is not UTC (an offset on a
//!   strategy without clock-aligned windows is an error);
//! - the layer's [`FailurePolicy`] (`"open"`, `"closed"`), [`HeaderStyle`] (`"x-ratelimit"`,
//!   `"ietf"`, `"both"`) and [`ResetFormat`] (`"delta"`, `"unix"`).

use std::fmt;
use std::num::NonZeroU32;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::layer::{FailurePolicy, HeaderStyle, ResetFormat};
use crate::{Quota, Rule, Strategy, WindowOffset};

/// A visitor of a string parsed by `parse`, its error shown as the message.
struct Text<F>(&'static str, F);

impl<T, E: fmt::Display, F: FnOnce(&str) -> Result<T, E>> Visitor<'_> for Text<F> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_str<Er: de::Error>(self, v: &str) -> Result<T, Er> {
        (self.1)(v).map_err(Er::custom)
    }
}

/// A quota whose burst was set: the notation and the burst.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaWithBurst {
    quota: String,
    burst: NonZeroU32,
}

impl Serialize for Quota {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match NonZeroU32::new(self.burst()) {
            Some(burst) if self.has_explicit_burst() => QuotaWithBurst {
                quota: self.to_string(),
                burst,
            }
            .serialize(s),
            _ => s.collect_str(self),
        }
    }
}

/// Reads a quota from its notation or from `{ quota, burst }`.
struct QuotaVisitor;

impl<'de> Visitor<'de> for QuotaVisitor {
    type Value = Quota;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a quota such as \"10/minute\", or { quota = \"10/minute\", burst = 50 }")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quota, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Quota, A::Error> {
        let q = QuotaWithBurst::deserialize(de::value::MapAccessDeserializer::new(map))?;
        let quota: Quota = q.quota.parse().map_err(de::Error::custom)?;
        Ok(quota.with_burst(q.burst))
    }
}

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(QuotaVisitor)
    }
}

impl Serialize for WindowOffset {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WindowOffset {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(Text(
            "a window offset such as \"+08:00\"",
            str::parse::<WindowOffset>,
        ))
    }
}

impl Serialize for Strategy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Strategy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(Text("a strategy name", str::parse::<Strategy>))
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleRepr {
    #[serde(default)]
    strategy: Strategy,
    quotas: Quotas,
    #[serde(default, skip_serializing_if = "WindowOffset::is_utc")]
    window_offset: WindowOffset,
}

/// A rule's quotas: one string when none has a burst, else a list.
#[derive(Serialize)]
#[serde(untagged)]
enum Quotas {
    Text(String),
    List(Vec<Quota>),
}

/// Reads either form of a rule's quotas (with the error of the form it is).
struct QuotasVisitor;

impl<'de> Visitor<'de> for QuotasVisitor {
    type Value = Quotas;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("quotas such as \"5/second; 100/minute\", or a list of quotas")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quotas, E> {
        Ok(Quotas::Text(v.to_owned()))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Quotas, A::Error> {
        let mut quotas = Vec::new();
        while let Some(q) = seq.next_element()? {
            quotas.push(q);
        }
        Ok(Quotas::List(quotas))
    }
}

impl<'de> Deserialize<'de> for Quotas {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(QuotasVisitor)
    }
}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let quotas = if self.quotas().iter().any(Quota::has_explicit_burst) {
            Quotas::List(self.quotas().to_vec())
        } else {
            let text: Vec<String> = self.quotas().iter().map(Quota::to_string).collect();
            Quotas::Text(text.join("; "))
        };
        RuleRepr {
            strategy: self.strategy(),
            quotas,
            window_offset: self.window_offset(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RuleRepr::deserialize(d)?;
        let rule = match r.quotas {
            Quotas::Text(text) => Rule::parse(r.strategy, &text),
            Quotas::List(quotas) => Rule::new(r.strategy, quotas),
        }
        .map_err(de::Error::custom)?;
        if r.window_offset.is_utc() {
            return Ok(rule);
        }
        if !matches!(r.strategy, Strategy::FixedWindow | Strategy::SlidingWindow) {
            return Err(de::Error::custom(format!(
                "window_offset has no meaning with strategy {} (only {} and {} have \
                 clock-aligned windows)",
                r.strategy,
                Strategy::FixedWindow,
                Strategy::SlidingWindow
            )));
        }
        Ok(rule.with_window_offset(r.window_offset))
    }
}

/// Unit-like enums written as fixed names.
macro_rules! named {
    ($t:ty, $what:literal, $($v:path => $n:literal),+ $(,)?) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(match self { $($v => $n,)+ })
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str(Text($what, |v: &str| match v {
                    $($n => Ok($v),)+
                    other => Err(format!(
                        concat!("unknown ", $what, " {:?} (expected one of: ", $($n, " ",)+ ")"),
                        other
                    )),
                }))
            }
        }
    };
}

named!(FailurePolicy, "failure policy", FailurePolicy::FailOpen => "open", FailurePolicy::FailClosed => "closed");
named!(HeaderStyle, "header style", HeaderStyle::XRateLimit => "x-ratelimit", HeaderStyle::Ietf => "ietf", HeaderStyle::Both => "both");
named!(ResetFormat, "reset format", ResetFormat::Delta => "delta", ResetFormat::Unix => "unix");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_types_round_trip_through_their_text_forms() {
        let q: Quota = serde_json::from_str("\"5/second\"").unwrap();
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"5/second\"");
        let s: Strategy = serde_json::from_str("\"token-bucket\"").unwrap();
        assert_eq!(s, Strategy::TokenBucket);
        let r: Rule =
            serde_json::from_str(r#"{"strategy":"moving-window","quotas":"2/second; 10/minute"}"#)
                .unwrap();
        assert_eq!(r.quotas().len(), 2);
        let back: Rule = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let f: FailurePolicy = serde_json::from_str("\"closed\"").unwrap();
        assert_eq!(f, FailurePolicy::FailClosed);
        let e = serde_json::from_str::<Quota>("\"5 per fortnight\"").unwrap_err();
        assert!(!e.to_string().is_empty());
        let e = serde_json::from_str::<HeaderStyle>("\"fancy\"").unwrap_err();
        assert!(e.to_string().contains("x-ratelimit"), "{e}");
    }
}
