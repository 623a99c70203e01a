//! `Serialize`/`Deserialize` on the configuration types (feature `serde`): a [`Quota`] as its text
//! notation (`"10/minute"`; its burst has no notation and is not written), a [`Strategy`] by its
//! command-line name (`"token-bucket"`), a [`Rule`] as `{ strategy, quotas }` with the quotas as
//! one `;`-separated string, the layer's [`FailurePolicy`] (`"open"`, `"closed"`),
//! [`HeaderStyle`] (`"x-ratelimit"`, `"ietf"`, `"both"`) and [`ResetFormat`] (`"delta"`, `"unix"`).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::layer::{FailurePolicy, HeaderStyle, ResetFormat};
use crate::{Quota, Rule, Strategy};

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

impl Serialize for Quota {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(Text("a quota such as \"10/minute\"", str::parse::<Quota>))
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
    quotas: String,
}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let quotas: Vec<String> = self.quotas().iter().map(Quota::to_string).collect();
        RuleRepr {
            strategy: self.strategy(),
            quotas: quotas.join("; "),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RuleRepr::deserialize(d)?;
        Rule::parse(r.strategy, &r.quotas).map_err(de::Error::custom)
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
