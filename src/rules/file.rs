//! The rules file: its TOML schema, validation with line and column, and precompiled matching.

mod pattern;

use std::fmt;
use std::ops::Range;

use http::{HeaderName, Method};
use serde::Deserialize;
use toml::Spanned;

use crate::{Rule, Strategy, WindowOffset, validate_name};
pub(crate) use pattern::PathPattern;

/// The largest rules file read (16 MiB): a bigger one is refused with an error, never parsed.
pub(crate) const MAX_RULES_FILE_BYTES: usize = 16 << 20;

/// The most limits (and the most exemptions) a rules file may have.
const MAX_LIMITS: usize = 10_000;

/// The most entries a limit's (or an exemption's) `methods` may list.
const MAX_METHODS: usize = 16;

/// A rules file that cannot be used: where (1-based line and column, when known) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulesError {
    position: Option<(usize, usize)>,
    message: String,
    /// The configuration error behind it, when a limit could not be built.
    cause: Option<crate::ConfigError>,
}

impl RulesError {
    /// An error at the start of byte range `span` of `text`.
    fn at(text: &str, span: Option<Range<usize>>, message: impl Into<String>) -> Self {
        let position = span.map(|s| {
            let mut end = s.start.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let before = text.get(..end).unwrap_or_default();
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            (line, column)
        });
        Self {
            position,
            message: message.into(),
            cause: None,
        }
    }

    /// An error without a position in the file (it cannot be read, it is too large).
    pub(crate) fn whole(message: impl Into<String>) -> Self {
        Self {
            position: None,
            message: message.into(),
            cause: None,
        }
    }

    /// This error with `cause` as its [`source`](std::error::Error::source).
    pub(crate) fn caused_by(mut self, cause: crate::ConfigError) -> Self {
        self.cause = Some(cause);
        self
    }

    /// The 1-based line and column the error points at, when it points somewhere.
    pub fn position(&self) -> Option<(usize, usize)> {
        self.position
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(f, "line {line}, column {column}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RulesError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// One limit of the file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitRepr {
    name: Spanned<String>,
    path: Option<Spanned<String>>,
    methods: Option<Vec<Spanned<String>>>,
    key: Option<Spanned<String>>,
    on_missing_key: Option<Spanned<MissingKey>>,
    strategy: Option<Spanned<String>>,
    quotas: Spanned<String>,
    burst: Option<Spanned<u32>>,
    cost: Option<u32>,
    shadow: Option<bool>,
    fail_mode: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    window_offset: Option<Spanned<String>>,
    queue_ms: Option<Spanned<u64>>,
    settle: Option<Spanned<String>>,
    tier: Option<Spanned<String>>,
    tiers: Option<Spanned<std::collections::BTreeMap<String, Spanned<String>>>>,
}

/// One exemption of the file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExemptRepr {
    path: Spanned<String>,
    methods: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    #[serde(default)]
    limit: Vec<LimitRepr>,
    #[serde(default)]
    exempt: Vec<ExemptRepr>,
}

/// The most tiers a limit may list.
const MAX_TIERS: usize = 64;

/// What a limit does with a request it has no key for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MissingKey {
    /// Answer `400`.
    Reject,
    /// Count it in the limit's one shared global bucket.
    Global,
}

/// One part of a limit's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KeyPart {
    /// The client's IP (the peer's, or the forwarded one from trusted proxies).
    Ip,
    /// One key shared by every request.
    Global,
    /// A request header's value.
    Header(HeaderName),
    /// The key of an extractor registered in code under this name
    /// ([`RulesOptions::key`](super::RulesOptions::key)): e.g. a user id an auth layer set.
    Named(Box<str>),
}

impl KeyPart {
    /// Parses one part: `ip`, `global`, `header:NAME`, or the name of a registered extractor.
    fn parse_part(text: &str, whole: &str) -> Result<Self, String> {
        match text {
            "ip" => Ok(KeyPart::Ip),
            "global" => Ok(KeyPart::Global),
            other => match other.strip_prefix("header:") {
                Some(name) if !name.is_empty() => HeaderName::from_bytes(name.as_bytes())
                    .map(KeyPart::Header)
                    .map_err(|_| format!("key {whole:?}: {name:?} is not a header name")),
                None if is_extractor_name(other) => Ok(KeyPart::Named(other.into())),
                _ => Err(format!(
                    "unknown key {other:?} (expected ip, global, header:NAME, the name of a key \
                     registered in code, or a composite such as ip+header:x-user)"
                )),
            },
        }
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Ip => f.write_str("ip"),
            KeyPart::Global => f.write_str("global"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
            KeyPart::Named(n) => f.write_str(n),
        }
    }
}

/// Whether `name` can name a registered key extractor: `[a-z0-9_-]{1,64}`, and not a word the
/// file reserves (`ip`, `global`).
pub(crate) fn is_extractor_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name != "ip"
        && name != "global"
}

/// A limit's key: one part or a composite (`ip+header:x-user`), every part required.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeySpec {
    parts: Vec<KeyPart>,
}

impl KeySpec {
    /// The parts, in the file's order.
    pub(crate) fn parts(&self) -> &[KeyPart] {
        &self.parts
    }

    /// Parses `ip`, `global`, `header:NAME`, the name of a key extractor registered in code, or a
    /// composite joined by `+` (a `+` that does not start another part belongs to the header name
    /// before it); the error says what is wrong.
    fn parse_text(text: &str) -> Result<Self, String> {
        let mut pieces: Vec<String> = Vec::new();
        for piece in text.split('+') {
            // A registered key's name after a header belongs to the header's name (header names
            // may hold a `+`): a composite names registered keys before headers.
            let starts_part = piece == "ip" || piece == "global" || piece.starts_with("header:");
            match pieces.last_mut() {
                Some(last) if !starts_part && last.starts_with("header:") => {
                    last.push('+');
                    last.push_str(piece);
                }
                _ => pieces.push(piece.to_owned()),
            }
        }
        let mut parts = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let part = KeyPart::parse_part(p, text)?;
            if parts.contains(&part) {
                return Err(format!("key {text:?} names {p:?} twice"));
            }
            parts.push(part);
        }
        Ok(Self { parts })
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            p.fmt(f)?;
        }
        Ok(())
    }
}

/// What a store failure on one limit of a rules file does (its `fail_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub(crate) enum FailMode {
    /// `"open"`: the limit is skipped (the request goes on to the other limits), counted in
    /// [`Stats::fail_open`](crate::Stats::fail_open).
    Open,
    /// `"closed"`: the request is answered `503`.
    Closed,
    /// `"local"`: during a Redis outage the store's local fallback decides the limit in this
    /// process, with its limit divided by the instances
    /// (`RedisStoreBuilder::local_fallback`). A file that sets it on a store without a fallback
    /// is refused; on the memory store, which never fails, it has no effect (warned once).
    Local,
}

/// One limit of a rules file, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LimitSpec {
    /// Unique name: the state's identity, the metrics label and the header item name.
    pub(crate) name: String,
    /// Which paths it applies to.
    pub(crate) path: PathPattern,
    /// Which methods (empty: all).
    pub(crate) methods: Vec<Method>,
    /// What identifies a client.
    pub(crate) key: KeySpec,
    /// Without a key: `None` takes the process-wide default.
    pub(crate) on_missing_key: Option<MissingKey>,
    /// Strategy and quotas.
    pub(crate) rule: Rule,
    /// Units per request.
    pub(crate) cost: u32,
    /// Decided and counted, never rejects.
    pub(crate) shadow: bool,
    /// A shaping queue (`queue_ms`): the longest a request may wait for its departure. The rule
    /// is then the queue's: the leaky bucket's one quota with a burst of the queue's depth
    /// (`queue_ms / T + 1` places, `T = period / limit`).
    pub(crate) queue: Option<std::time::Duration>,
    /// Where the request's actual cost comes from once the handler answered (`settle`); `None`:
    /// the estimate (`cost`) stands, unless a [`Settle`](crate::layer::Settle) marker names the
    /// limit.
    pub(crate) settle: Option<SettleSpec>,
    /// The most requests in flight per key among the matching ones (`concurrency`), taken once
    /// every quota admitted a request and held until its response body ends or it is dropped.
    pub(crate) concurrency: Option<std::num::NonZeroU32>,
    /// What a store failure on this limit does (`fail_mode`); `None`: the layer's policy (and,
    /// on a store with a local fallback, that fallback).
    pub(crate) fail_mode: Option<FailMode>,
    /// Where a request's tier is read (`tier`): a header (`header:x-plan`) or a key extractor
    /// registered in code; `None`: no tiers, `rule` applies to every request.
    pub(crate) tier: Option<KeyPart>,
    /// The rule of each tier (`tiers`), by the tier's value; a request whose value is missing or
    /// not listed takes `rule` (the default tier). Each tier has the limit's strategy, burst and
    /// window offset.
    pub(crate) tiers: Vec<(String, Rule)>,
}

/// Requests no limit applies to (`[[exempt]]`): a path pattern and, optionally, methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exempt {
    /// Which paths.
    pub(crate) path: PathPattern,
    /// Which methods (empty: all).
    pub(crate) methods: Vec<Method>,
}

impl Exempt {
    /// Whether a request of `method` on raw path `path` is exempt.
    #[inline]
    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method)) && self.path.matches(path)
    }
}

/// Where a limit of a rules file learns what a request actually cost (its `settle` field).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum SettleSpec {
    /// `"marker"`: a [`Settle`](crate::layer::Settle) marker without a limiter name, as well as
    /// one naming the limit (which every limit takes).
    Marker,
    /// `"header:NAME"`: the response header `NAME`, a decimal count of units, as
    /// [`SettleFrom::header`](crate::layer::SettleFrom::header).
    Header(HeaderName),
    /// `"trailer:NAME"`: the response trailer `NAME` (after the body), as
    /// [`SettleFrom::trailer`](crate::layer::SettleFrom::trailer).
    Trailer(HeaderName),
}

impl SettleSpec {
    fn parse_text(text: &str) -> Result<Self, String> {
        if text == "marker" {
            return Ok(Self::Marker);
        }
        if let Some(name) = text.strip_prefix("header:") {
            return HeaderName::from_bytes(name.as_bytes())
                .map(Self::Header)
                .map_err(|_| format!("settle {text:?}: {name:?} is not a header name"));
        }
        if let Some(name) = text.strip_prefix("trailer:") {
            return HeaderName::from_bytes(name.as_bytes())
                .map(Self::Trailer)
                .map_err(|_| format!("settle {text:?}: {name:?} is not a trailer name"));
        }
        Err(format!(
            "settle {text:?}: expected \"marker\", \"header:NAME\" or \"trailer:NAME\""
        ))
    }
}

impl LimitSpec {
    /// Whether the limit applies to a request of `method` on raw path `path`.
    #[inline]
    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method)) && self.path.matches(path)
    }

    /// Whether some request could match both limits (its method and path).
    pub(crate) fn overlaps(&self, other: &Self) -> bool {
        let methods = self.methods.is_empty()
            || other.methods.is_empty()
            || self.methods.iter().any(|m| other.methods.contains(m));
        methods && self.path.overlaps(&other.path)
    }
}

/// A parsed and validated rules file: its limits in the file's order, and its exemptions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RulesFile {
    /// The limits.
    pub(crate) limits: Vec<LimitSpec>,
    /// Requests no limit applies to (a health check, say).
    pub(crate) exempt: Vec<Exempt>,
}

impl RulesFile {
    /// Parses and validates the text of a rules file.
    ///
    /// # Errors
    /// [`RulesError`] with the line and column of the first problem: TOML that does not parse, an
    /// unknown field, strategy or key, a quota that does not parse, a duplicate or invalid name,
    /// a path that can never match, a `burst` with a window strategy, a `window_offset` that does
    /// not parse or with a strategy without clock-aligned windows, a `queue_ms` that a queue
    /// cannot honour, a reserved field, more than [`MAX_LIMITS`] limits or [`MAX_METHODS`]
    /// methods in one limit. A limit's `fail_mode = "local"` is accepted here: whether its store
    /// has a local fallback is checked when [`Rules`](super::Rules) are built on one.
    #[cfg(test)]
    pub(crate) fn parse(text: &str) -> Result<Self, RulesError> {
        Self::parse_on(text, true)
    }

    /// [`RulesFile::parse`] for a store with a local fallback (`local_fallback`), or without
    /// one, where a limit's `fail_mode = "local"` is an error at its line and column.
    pub(crate) fn parse_on(text: &str, local_fallback: bool) -> Result<Self, RulesError> {
        if text.len() > MAX_RULES_FILE_BYTES {
            return Err(RulesError::whole(format!(
                "the rules file has {} bytes, more than the {MAX_RULES_FILE_BYTES} allowed",
                text.len()
            )));
        }
        let repr: FileRepr = toml::from_str(text)
            .map_err(|e| RulesError::at(text, e.span(), e.message().trim_end().to_owned()))?;
        let mut limits: Vec<LimitSpec> = Vec::with_capacity(repr.limit.len());
        let mut names = std::collections::HashSet::new();
        for (n, l) in repr.limit.into_iter().enumerate() {
            let err = |span: Range<usize>, m: String| RulesError::at(text, Some(span), m);
            if n == MAX_LIMITS {
                return Err(err(
                    l.name.span(),
                    format!("more than {MAX_LIMITS} limits: a rules file may have {MAX_LIMITS}"),
                ));
            }
            let name = l.name.get_ref().clone();
            validate_name(&name).map_err(|e| err(l.name.span(), e.to_string()))?;
            if !names.insert(name.clone()) {
                return Err(err(l.name.span(), format!("duplicate limit name {name:?}")));
            }
            let fail_mode = match &l.fail_mode {
                Some(v) => Some(match v.get_ref().as_str() {
                    "open" => FailMode::Open,
                    "closed" => FailMode::Closed,
                    "local" if !local_fallback => {
                        return Err(err(
                            v.span(),
                            "fail_mode = \"local\" needs a store with a local fallback, and this \
                             one has none (run the server with --fail-mode local --instances N, \
                             or build the Redis store with RedisStoreBuilder::local_fallback)"
                                .into(),
                        ));
                    }
                    "local" => FailMode::Local,
                    other => {
                        return Err(err(
                            v.span(),
                            format!(
                                "fail_mode: expected \"open\", \"closed\" or \"local\", not \
                                 {other:?}"
                            ),
                        ));
                    }
                }),
                None => None,
            };
            let concurrency = match &l.concurrency {
                Some(c) => Some(
                    u32::try_from(*c.get_ref())
                        .ok()
                        .and_then(std::num::NonZeroU32::new)
                        .ok_or_else(|| {
                            err(
                                c.span(),
                                format!(
                                    "concurrency must be from 1 to {}, not {}",
                                    u32::MAX,
                                    c.get_ref()
                                ),
                            )
                        })?,
                ),
                None => None,
            };
            let path = match &l.path {
                Some(p) => PathPattern::parse_text(p.get_ref()).map_err(|m| err(p.span(), m))?,
                None => PathPattern::parse("/*")?,
            };
            let methods = methods_of(l.methods.as_deref(), &err)?;
            let key = match &l.key {
                Some(k) => KeySpec::parse_text(k.get_ref()).map_err(|m| err(k.span(), m))?,
                None => KeySpec {
                    parts: vec![KeyPart::Ip],
                },
            };
            let strategy = match &l.strategy {
                Some(s) => s
                    .get_ref()
                    .parse::<Strategy>()
                    .map_err(|e| err(s.span(), e.to_string()))?,
                None => Strategy::default(),
            };
            let quotas = crate::parse_quotas(l.quotas.get_ref())
                .map_err(|e| err(l.quotas.span(), format!("quotas: {e}")))?;
            let quotas = match &l.burst {
                Some(b) if !strategy.is_bucket() => {
                    return Err(err(
                        b.span(),
                        format!(
                            "burst has no meaning with strategy {strategy} (only token-bucket \
                             and leaky-bucket have one)"
                        ),
                    ));
                }
                Some(b) => {
                    let burst = std::num::NonZeroU32::new(*b.get_ref())
                        .ok_or_else(|| err(b.span(), "burst must be at least 1".into()))?;
                    quotas.into_iter().map(|q| q.with_burst(burst)).collect()
                }
                None => quotas,
            };
            let shadow = l.shadow.unwrap_or(false);
            if let (Some(c), true) = (&l.concurrency, shadow) {
                return Err(err(
                    c.span(),
                    "concurrency has no meaning on a shadow limit (a shadow limit never rejects)"
                        .into(),
                ));
            }
            let (quotas, queue) = match &l.queue_ms {
                Some(q) => {
                    let (quota, wait) = queue_quota(strategy, &quotas, *q.get_ref(), shadow)
                        .map_err(|m| err(q.span(), m))?;
                    if let Some(b) = &l.burst {
                        return Err(err(
                            b.span(),
                            "burst has no meaning with queue_ms (the queue's depth is its burst)"
                                .into(),
                        ));
                    }
                    (vec![quota], Some(wait))
                }
                None => (quotas, None),
            };
            let mut rule =
                Rule::new(strategy, quotas).map_err(|e| err(l.quotas.span(), e.to_string()))?;
            if let Some(o) = &l.window_offset {
                let offset = o
                    .get_ref()
                    .parse::<WindowOffset>()
                    .map_err(|e| err(o.span(), format!("window_offset: {e}")))?;
                if !matches!(strategy, Strategy::FixedWindow | Strategy::SlidingWindow) {
                    return Err(err(
                        o.span(),
                        format!(
                            "window_offset has no meaning with strategy {strategy} (only \
                             {} and {} have clock-aligned windows)",
                            Strategy::FixedWindow,
                            Strategy::SlidingWindow
                        ),
                    ));
                }
                rule = rule.with_window_offset(offset);
            }
            let settle = match &l.settle {
                Some(v) => Some(SettleSpec::parse_text(v.get_ref()).map_err(|m| err(v.span(), m))?),
                None => None,
            };
            let (tier, tiers) = tiers_of(&l, &rule, &err)?;
            let spec = LimitSpec {
                tier,
                tiers,
                settle,
                concurrency,
                fail_mode,
                name,
                path,
                methods,
                key,
                on_missing_key: l.on_missing_key.map(Spanned::into_inner),
                rule,
                cost: l.cost.unwrap_or(1),
                shadow,
                queue,
            };
            if let Some(q) = &l.queue_ms {
                // A request leaves once, at one departure: under two queues it would take the
                // later one, and another request could leave with it under the other queue.
                let other = limits
                    .iter()
                    .find(|o| o.queue.is_some() && o.overlaps(&spec));
                if let Some(o) = other {
                    return Err(err(
                        q.span(),
                        format!(
                            "queue_ms: limit {:?} (path {:?}) and limit {:?} (path {:?}) have \
                             queues that can apply to the same request; a request may wait in \
                             one shaping queue at most (give them paths or methods no request \
                             matches both of)",
                            spec.name,
                            spec.path.as_str(),
                            o.name,
                            o.path.as_str()
                        ),
                    ));
                }
            }
            limits.push(spec);
        }
        let mut exempt = Vec::with_capacity(repr.exempt.len());
        for e in &repr.exempt {
            let err = |span: Range<usize>, m: String| RulesError::at(text, Some(span), m);
            if exempt.len() == MAX_LIMITS {
                return Err(err(
                    e.path.span(),
                    format!("more than {MAX_LIMITS} exemptions"),
                ));
            }
            let path =
                PathPattern::parse_text(e.path.get_ref()).map_err(|m| err(e.path.span(), m))?;
            let methods = methods_of(e.methods.as_deref(), &err)?;
            exempt.push(Exempt { path, methods });
        }
        Ok(Self { limits, exempt })
    }
}

/// The methods of a `methods` list: upper-cased, each once, at most [`MAX_METHODS`].
fn methods_of(
    list: Option<&[Spanned<String>]>,
    err: &impl Fn(Range<usize>, String) -> RulesError,
) -> Result<Vec<Method>, RulesError> {
    let list = list.unwrap_or_default();
    if let Some(extra) = list.get(MAX_METHODS) {
        return Err(err(
            extra.span(),
            format!("more than {MAX_METHODS} methods: a limit may list {MAX_METHODS}"),
        ));
    }
    let mut methods = Vec::new();
    for m in list {
        let upper = m.get_ref().to_ascii_uppercase();
        let method = Method::from_bytes(upper.as_bytes())
            .ok()
            .filter(|_| !upper.is_empty())
            .ok_or_else(|| err(m.span(), format!("{:?} is not a method", m.get_ref())))?;
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    Ok(methods)
}

/// Where a limit's tier is read, and each tier's rule by name.
type Tiers = (Option<KeyPart>, Vec<(String, Rule)>);

/// A limit's `tier` and `tiers`: where the tier is read, and each tier's rule (the limit's
/// strategy, burst and window offset with the tier's quotas).
fn tiers_of(
    l: &LimitRepr,
    rule: &Rule,
    err: &impl Fn(Range<usize>, String) -> RulesError,
) -> Result<Tiers, RulesError> {
    let (from, table) = match (&l.tier, &l.tiers) {
        (None, None) => return Ok((None, Vec::new())),
        (Some(t), None) => {
            return Err(err(
                t.span(),
                "tier without tiers: list each tier's quotas (tiers = { pro = \"1000/hour\" })"
                    .into(),
            ));
        }
        (None, Some(t)) => {
            return Err(err(
                t.span(),
                "tiers without tier: say where a request's tier is read (tier = \"header:x-plan\" \
                 or a key registered in code)"
                    .into(),
            ));
        }
        (Some(from), Some(table)) => (from, table),
    };
    let part =
        KeyPart::parse_part(from.get_ref(), from.get_ref()).map_err(|m| err(from.span(), m))?;
    if matches!(part, KeyPart::Ip | KeyPart::Global) {
        return Err(err(
            from.span(),
            format!(
                "tier = {:?}: a tier is read from header:NAME or a key registered in code",
                from.get_ref()
            ),
        ));
    }
    if let Some(q) = &l.queue_ms {
        return Err(err(
            q.span(),
            "queue_ms with tiers: a shaping queue has one rate".into(),
        ));
    }
    if table.get_ref().len() > MAX_TIERS {
        return Err(err(table.span(), format!("more than {MAX_TIERS} tiers")));
    }
    let mut tiers = Vec::with_capacity(table.get_ref().len());
    for (name, quotas) in table.get_ref() {
        if name.is_empty() {
            return Err(err(quotas.span(), "a tier's name cannot be empty".into()));
        }
        let parsed = crate::parse_quotas(quotas.get_ref())
            .map_err(|e| err(quotas.span(), format!("tier {name:?}: {e}")))?;
        let burst = rule
            .quotas()
            .first()
            .filter(|q| q.has_explicit_burst())
            .and_then(|q| std::num::NonZeroU32::new(q.burst()));
        let parsed = match burst {
            Some(b) => parsed.into_iter().map(|q| q.with_burst(b)).collect(),
            None => parsed,
        };
        let tier_rule = Rule::new(rule.strategy(), parsed)
            .map_err(|e| err(quotas.span(), format!("tier {name:?}: {e}")))?
            .with_window_offset(rule.window_offset());
        tiers.push((name.clone(), tier_rule));
    }
    Ok((Some(part), tiers))
}

/// The quota of a shaping queue of `max_wait_ms` on `quotas`: the one quota of a leaky bucket,
/// with a burst of the queue's depth (`max_wait / T + 1` places, `T = period / limit`), and the
/// maximum wait; or why there cannot be one.
fn queue_quota(
    strategy: Strategy,
    quotas: &[crate::Quota],
    max_wait_ms: u64,
    shadow: bool,
) -> Result<(crate::Quota, std::time::Duration), String> {
    if strategy != Strategy::LeakyBucket {
        return Err(format!(
            "queue_ms needs strategy = \"{}\" (a queue drains at a constant rate), not {strategy}",
            Strategy::LeakyBucket
        ));
    }
    if shadow {
        return Err("queue_ms has no meaning on a shadow limit (it never delays)".into());
    }
    let [quota] = quotas else {
        return Err("queue_ms drains one quota: give the limit exactly one".into());
    };
    let max_wait = std::time::Duration::from_millis(max_wait_ms);
    match crate::layer::queue_quota(quota, max_wait) {
        Ok((queued, _)) => Ok((queued, max_wait)),
        Err(emission) => Err(format!(
            "queue_ms = {max_wait_ms} is shorter than one interval ({:?}) of {quota}",
            std::time::Duration::from_nanos(emission)
        )),
    }
}

#[cfg(test)]
mod tests;
