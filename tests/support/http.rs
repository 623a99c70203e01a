//! A real HTTP server on 127.0.0.1:0 and a small client, for the layer's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// An axum app served on 127.0.0.1:0 with `ConnectInfo<SocketAddr>`; stopped on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A response read whole.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// A header that must be there, as a number.
    pub fn num(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:?}"))
            .parse()
            .unwrap()
    }

    pub fn count(&self, name: &str) -> usize {
        self.headers.get_all(name).iter().count()
    }
}

/// An HTTP/1 client whose connections come from `source` (any 127.x.y.z address works on Linux).
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl TestClient {
    pub fn new() -> Self {
        Self::from_ip("127.0.0.1".parse().unwrap())
    }

    pub fn from_ip(source: IpAddr) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_local_address(Some(source));
        Self {
            client: Client::builder(TokioExecutor::new()).build(conn),
        }
    }

    pub async fn send(&self, req: Request<Full<Bytes>>) -> Resp {
        let res = self.client.request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Resp {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    pub async fn get(&self, url: &str) -> Resp {
        self.send(Request::get(url).body(Full::default()).unwrap())
            .await
    }

    pub async fn get_with(&self, url: &str, headers: &[(&str, &str)]) -> Resp {
        let mut b = Request::get(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.send(b.body(Full::default()).unwrap()).await
    }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The value of the series `series` (its name and labels, exactly) in a Prometheus text page.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series) && l.as_bytes().get(series.len()) == Some(&b' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A body of one data frame, then trailers.
pub struct WithTrailers {
    pub data: Option<Bytes>,
    pub trailers: Option<HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let frame = match self.data.take() {
            Some(d) => Some(http_body::Frame::data(d)),
            None => self.trailers.take().map(http_body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }
}

#[allow(unused_imports)] // The Redis tests log through `crate::logs` directly.
pub(crate) use crate::logs::{Logs, log_into};

/// The Prometheus recorder installed as this test binary's global recorder, once: for the
/// metrics resolved when first counted (`tollgate_settle_unmatched_total`), not when a layer is
/// built. Tests that read it use series of their own (its counters are shared by the binary).
pub fn global_metrics() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("no other global recorder in this binary");
        handle
    })
}
