//! [`ResponseBody`]: the inner service's body, or one of the layer's own answers.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use pin_project_lite::pin_project;

/// The error type of [`ResponseBody`]: the inner body's error, boxed.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Boxed = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

pin_project! {
    /// The body of every response a [`RateLimitService`](super::RateLimitService) returns: the
    /// inner service's body as it is (any `http_body::Body` of [`Bytes`], e.g. axum's, hyper's or
    /// tonic's), or the body of an answer the layer made on its own (a 429, 400 or 503, or a gRPC
    /// trailers-only answer with no body at all).
    ///
    /// A responder ([`OnRejected`](super::OnRejected)) builds it with `From`: a `String`, `&'static
    /// str`, [`Bytes`], `http_body_util::Full<Bytes>`, `http_body_util::Empty<Bytes>` or (with the
    /// `axum` feature) `axum::body::Body`; [`ResponseBody::new`] takes any other body.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

/// Watches the inner body on behalf of the layer: a settlement from the body's end, a concurrency
/// slot held while it streams. What it does at the end it does when dropped: after the last frame,
/// or when the body is dropped unfinished (the client went away).
pub(crate) trait Tail: Send {
    /// A data frame went by.
    fn data(&mut self, chunk: &[u8]) {
        let _ = chunk;
    }

    /// The trailers went by.
    fn trailers(&mut self, trailers: &http::HeaderMap) {
        let _ = trailers;
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, tails: Vec<Box<dyn Tail>> },
        Full { data: Option<Bytes> },
        Boxed { #[pin] body: Boxed },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner {
                body,
                tails: Vec::new(),
            },
        }
    }

    /// Adds a watcher of the inner body (nothing for the layer's own answers, which end at once).
    pub(crate) fn watch(&mut self, tail: Box<dyn Tail>) {
        if let Kind::Inner { tails, .. } = &mut self.kind {
            tails.push(tail);
        }
    }

    /// A body of the layer's own, in one piece.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    /// An empty body (a gRPC trailers-only answer).
    pub fn empty() -> Self {
        Self {
            kind: Kind::Full { data: None },
        }
    }

    /// Any other body, boxed.
    pub fn new<T>(body: T) -> Self
    where
        T: Body<Data = Bytes> + Send + 'static,
        T::Error: Into<BoxError>,
    {
        Self {
            kind: Kind::Boxed {
                body: body.map_err(Into::into).boxed_unsync(),
            },
        }
    }

    /// Whether this is the inner service's body (not an answer of the layer's own).
    pub fn is_inner(&self) -> bool {
        matches!(self.kind, Kind::Inner { .. })
    }
}

impl ResponseBody<std::convert::Infallible> {
    /// An answer of the layer's own (never an inner body) as the body of any inner service.
    pub(crate) fn cast<B>(self) -> ResponseBody<B> {
        let kind = match self.kind {
            Kind::Inner { body, .. } => match body {},
            Kind::Full { data } => Kind::Full { data },
            Kind::Boxed { body } => Kind::Boxed { body },
        };
        ResponseBody { kind }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f
                .debug_struct("ResponseBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
            Kind::Boxed { .. } => f.write_str("ResponseBody::Boxed"),
        }
    }
}

impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<B> From<String> for ResponseBody<B> {
    fn from(s: String) -> Self {
        Self::full(s)
    }
}

impl<B> From<&'static str> for ResponseBody<B> {
    fn from(s: &'static str) -> Self {
        Self::full(Bytes::from_static(s.as_bytes()))
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(b: Bytes) -> Self {
        Self::full(b)
    }
}

impl<B> From<http_body_util::Full<Bytes>> for ResponseBody<B> {
    fn from(b: http_body_util::Full<Bytes>) -> Self {
        Self::new(b)
    }
}

impl<B> From<http_body_util::Empty<Bytes>> for ResponseBody<B> {
    fn from(_: http_body_util::Empty<Bytes>) -> Self {
        Self::empty()
    }
}

#[cfg(feature = "axum")]
impl<B> From<axum::body::Body> for ResponseBody<B> {
    fn from(b: axum::body::Body) -> Self {
        Self::new(b)
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, tails } => {
                let frame = ready!(body.poll_frame(cx));
                if !tails.is_empty() {
                    match &frame {
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref() {
                                tails.iter_mut().for_each(|t| t.data(data));
                            } else if let Some(trailers) = frame.trailers_ref() {
                                tails.iter_mut().for_each(|t| t.trailers(trailers));
                            }
                        }
                        // The end, or an error that ends it: the watchers finish now.
                        _ => tails.clear(),
                    }
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Boxed { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Boxed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Boxed { body } => body.size_hint(),
        }
    }
}
