//! The layer's own answers to gRPC requests: trailers-only responses with a `grpc-status`.
//!
//! A request whose `content-type` is `application/grpc` (or `application/grpc+proto`,
//! `application/grpc;...`; gRPC-Web is not handled) is answered with HTTP 200, `content-type:
//! application/grpc`, no body, and:
//!
//! | HTTP answer | `grpc-status` |
//! | --- | --- |
//! | 429 rate limited | 8 `RESOURCE_EXHAUSTED`, with `retry-after` metadata and `google.rpc.RetryInfo` in `grpc-status-details-bin` (both absent when the cost can never be admitted) |
//! | 400 no key | 3 `INVALID_ARGUMENT` |
//! | 503 store failed, failing closed | 14 `UNAVAILABLE` |

use std::fmt::Write as _;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response};

use super::body::ResponseBody;
use super::response::Refusal;
use crate::decision::{Decision, Outcome};

static APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// gRPC status codes the layer answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument = 3,
    ResourceExhausted = 8,
    Unavailable = 14,
}

/// Whether the request is a gRPC call (not gRPC-Web).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"+") || rest.starts_with(b";"))
    })
}

/// A trailers-only answer with `code` and `message`.
pub(crate) fn status<B>(code: Code, message: &str) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::empty());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, APPLICATION_GRPC.clone());
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(code as u16));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE.clone(), v);
    }
    res
}

/// `RESOURCE_EXHAUSTED` for a rejected request; the layer adds the rate-limit metadata and
/// `retry-after`.
pub(crate) fn rejected<B>(d: &Decision) -> Response<ResponseBody<B>> {
    let message = match (d.outcome(), d.retry_after_secs()) {
        (Outcome::Exceeds, _) | (_, None) => format!(
            "rate limited: the request's cost exceeds the rate limit ({}); it can never be admitted",
            d.limit()
        ),
        (_, Some(secs)) => format!(
            "rate limited: retry in {secs} second{}",
            if secs == 1 { "" } else { "s" }
        ),
    };
    let mut res = status(Code::ResourceExhausted, &message);
    if let (Outcome::Rejected, Some(wait)) = (d.outcome(), d.retry_after()) {
        let details = status_details(Code::ResourceExhausted, &message, wait);
        if let Ok(v) = HeaderValue::from_str(&base64(&details)) {
            res.headers_mut().insert(GRPC_STATUS_DETAILS.clone(), v);
        }
    }
    res
}

/// `INVALID_ARGUMENT` without a key, `UNAVAILABLE` when failing closed.
pub(crate) fn refused<B>(refusal: Refusal<'_>) -> Response<ResponseBody<B>> {
    match refusal {
        Refusal::NoKey { error, .. } => status(Code::InvalidArgument, &error.to_string()),
        Refusal::StoreFailed(_) => status(Code::Unavailable, "the rate limiter cannot decide"),
        Refusal::OverCap { cap, waited } => status(
            Code::ResourceExhausted,
            &format!(
                "Too Many Requests: {}",
                super::response::over_cap_detail(cap, waited)
            ),
        ),
    }
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and `%`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A `google.rpc.Status` carrying one `google.rpc.RetryInfo`, in protobuf's wire format (written
/// by hand: three nested messages do not justify a protobuf dependency).
fn status_details(code: Code, message: &str, wait: std::time::Duration) -> Vec<u8> {
    // google.protobuf.Duration { int64 seconds = 1; int32 nanos = 2; }
    let mut duration = Vec::new();
    if wait.as_secs() > 0 {
        varint_field(&mut duration, 1, wait.as_secs());
    }
    if wait.subsec_nanos() > 0 {
        varint_field(&mut duration, 2, u64::from(wait.subsec_nanos()));
    }
    // google.rpc.RetryInfo { google.protobuf.Duration retry_delay = 1; }
    let mut retry_info = Vec::new();
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any { string type_url = 1; bytes value = 2; }
    let mut any = Vec::new();
    bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status { int32 code = 1; string message = 2; repeated google.protobuf.Any details = 3; }
    let mut status = Vec::new();
    varint_field(&mut status, 1, code as u64);
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u64, n: u64) {
    varint(out, field << 3);
    varint(out, n);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Standard base64 without padding, as gRPC's `-bin` metadata is sent.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            let index = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(
                ALPHABET.get(index as usize).copied().unwrap_or(b'A'),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types() {
        let h = |v: &'static str| {
            let mut m = HeaderMap::new();
            m.insert(CONTENT_TYPE, HeaderValue::from_static(v));
            m
        };
        assert!(is_grpc(&h("application/grpc")));
        assert!(is_grpc(&h("application/grpc+proto")));
        assert!(is_grpc(&h("application/grpc;charset=utf-8")));
        assert!(!is_grpc(&h("application/grpc-web")));
        assert!(!is_grpc(&h("application/grpc-web+proto")));
        assert!(!is_grpc(&h("application/json")));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn base64_matches_the_rfc_4648_vectors_without_padding() {
        for (input, output) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), output, "{input}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("retry in 5 s"), "retry in 5 s");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
    }

    #[test]
    fn retry_info_wire_format() {
        let d = status_details(Code::ResourceExhausted, "m", std::time::Duration::new(2, 5));
        let any = b"type.googleapis.com/google.rpc.RetryInfo";
        let mut want = vec![0x08, 8, 0x12, 1, b'm', 0x1a, (2 + any.len() + 2 + 6) as u8];
        want.extend_from_slice(&[0x0a, any.len() as u8]);
        want.extend_from_slice(any);
        want.extend_from_slice(&[0x12, 6, 0x0a, 4, 0x08, 2, 0x10, 5]);
        assert_eq!(d, want);
    }
}
