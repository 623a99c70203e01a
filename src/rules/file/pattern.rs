//! Path patterns of a rules file: compiled once, matched without allocating.

use super::RulesError;

/// A segment of a path pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Segment {
    Literal(Box<str>),
    /// `{x}`: one non-empty segment.
    Param,
}

/// A compiled path pattern: `/login` (exactly), `/api/*` (`/api/` and below, not `/api`), `{x}`
/// for one non-empty segment. Raw path, case-sensitive, no trailing-slash folding. Matching walks
/// the path once and allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PathPattern {
    text: Box<str>,
    segments: Box<[Segment]>,
    /// Ends with `/*`: the path may go on below the segments.
    prefix: bool,
}

impl PathPattern {
    /// Compiles `text`.
    ///
    /// # Errors
    /// A [`RulesError`] without a position for a pattern that could never match a request path:
    /// not starting with `/`, a `*` other than a final `/*`, braces that are not a whole `{name}`
    /// segment, `?` or `#`.
    pub(crate) fn parse(text: &str) -> Result<Self, RulesError> {
        Self::parse_text(text).map_err(RulesError::whole)
    }

    pub(super) fn parse_text(text: &str) -> Result<Self, String> {
        if !text.starts_with('/') {
            return Err(format!("path {text:?} must start with \"/\""));
        }
        if text.contains(|c: char| c.is_ascii_control() || c == ' ') {
            return Err(format!(
                "path {text:?} can never match: a request path holds no space or control \
                 character (NUL included)"
            ));
        }
        if text.contains(['?', '#']) {
            return Err(format!(
                "path {text:?} can never match: a request path holds no \"?\" or \"#\""
            ));
        }
        let (base, prefix) = match text.strip_suffix("/*") {
            Some(base) => (base, true),
            None => (text, false),
        };
        let mut segments = Vec::new();
        for seg in base.split('/') {
            if seg.contains('*') {
                return Err(format!(
                    "path {text:?}: \"*\" is only allowed as a final \"/*\""
                ));
            }
            if let Some(inner) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                if inner.is_empty() || inner.contains(['{', '}']) {
                    return Err(format!("path {text:?}: {seg:?} is not a {{name}} segment"));
                }
                segments.push(Segment::Param);
            } else if seg.contains(['{', '}']) {
                return Err(format!(
                    "path {text:?}: {seg:?} mixes braces with text (a {{name}} is a whole segment)"
                ));
            } else {
                segments.push(Segment::Literal(seg.into()));
            }
        }
        Ok(Self {
            text: text.into(),
            segments: segments.into(),
            prefix,
        })
    }

    /// The pattern as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the raw request path `path` matches.
    #[inline]
    pub(crate) fn matches(&self, path: &str) -> bool {
        // `/*`, the default: every path (each starts with `/`), without splitting it.
        if self.prefix && matches!(&*self.segments, [Segment::Literal(l)] if l.is_empty()) {
            return path.starts_with('/');
        }
        let mut parts = path.split('/');
        for seg in self.segments.iter() {
            let Some(part) = parts.next() else {
                return false;
            };
            let ok = match seg {
                Segment::Literal(l) => **l == *part,
                Segment::Param => !part.is_empty(),
            };
            if !ok {
                return false;
            }
        }
        // `/x/*` needs at least one more `/` (possibly an empty segment); an exact pattern none.
        parts.next().is_some() == self.prefix
    }
}

impl PathPattern {
    /// Whether some request path matches both patterns (exact: each segment pair must admit a
    /// common value, and the lengths must fit, a `/*` pattern taking any longer path).
    pub(crate) fn overlaps(&self, other: &Self) -> bool {
        let common =
            self.segments
                .iter()
                .zip(other.segments.iter())
                .all(|pair| match pair {
                    (Segment::Literal(a), Segment::Literal(b)) => a == b,
                    (Segment::Literal(l), Segment::Param)
                    | (Segment::Param, Segment::Literal(l)) => !l.is_empty(),
                    (Segment::Param, Segment::Param) => true,
                });
        let (a, b) = (self.segments.len(), other.segments.len());
        let lengths = match (self.prefix, other.prefix) {
            (false, false) => a == b,
            (false, true) => a > b,
            (true, false) => b > a,
            (true, true) => true,
        };
        common && lengths
    }
}
