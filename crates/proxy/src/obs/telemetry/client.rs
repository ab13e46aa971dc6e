//! The OTLP exporter's HTTP client: hyper-util's client running on the
//! proxy's control runtime. The SDK calls it from its own export threads
//! (outside any runtime), so each request is spawned on the runtime the
//! exporter was started from and its answer handed back over a channel.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// The largest collector answer read (OTLP answers are tiny).
const MAX_RESPONSE: usize = 1 << 20;

/// Sends export requests through hyper on a tokio runtime.
#[derive(Clone, Debug)]
pub(crate) struct ExportClient {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

/// Why one export request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    /// Connect, send or receive failed.
    #[error("OTLP export request failed")]
    Request(#[source] hyper_util::client::legacy::Error),
    /// The answer's body could not be read.
    #[error("OTLP export: cannot read the collector's answer")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// No answer within the timeout.
    #[error("OTLP export timed out after {0:?}")]
    Timeout(Duration),
    /// The runtime stopped before the request finished.
    #[error("OTLP export: the runtime shut down before the request finished")]
    RuntimeGone,
}

// === impl ExportClient ===

impl ExportClient {
    /// A client spawning its requests on `runtime`.
    pub(crate) fn new(runtime: tokio::runtime::Handle, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            client,
            runtime,
            timeout,
        }
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, ExportError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (client, timeout) = (self.client.clone(), self.timeout);
        let request = request.map(Full::new);
        self.runtime.spawn(async move {
            let exchange = async {
                let resp = client
                    .request(request)
                    .await
                    .map_err(ExportError::Request)?;
                let (head, body) = resp.into_parts();
                let body = Limited::new(body, MAX_RESPONSE)
                    .collect()
                    .await
                    .map_err(ExportError::Body)?
                    .to_bytes();
                Ok(Response::from_parts(head, body))
            };
            let result = tokio::time::timeout(timeout, exchange)
                .await
                .unwrap_or(Err(ExportError::Timeout(timeout)));
            let _ = tx.send(result);
        });
        rx.await.unwrap_or(Err(ExportError::RuntimeGone))
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        self.send(request).await.map_err(Into::into)
    }
}
