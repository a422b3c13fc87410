//! The TCP side of `wick serve`: accepting connections so that no client,
//! however slow, idle or numerous, can hold the server.
//!
//! - A connection must send a complete request head within the client
//!   timeout of connecting or of its last response (hyper's header timeout),
//!   so idle keep-alive connections and slow headers are closed.
//! - A write that stalls (a client that stopped reading) for the client
//!   timeout fails the connection.
//! - At most `max_connections` are open. At the cap, the oldest idle
//!   connection (no request in progress) is closed to make room, so
//!   `/health` and real requests still get in; with none idle, the one that
//!   has been sending a request body longest, if for over [`SLOW_UPLOAD`]
//!   (a whole body arrives in milliseconds from any client that is not
//!   holding a slot on purpose); with neither, the new connection gets a
//!   503 and is closed.
//! - On shutdown, idle connections close at once and busy ones after their
//!   response; whatever is left when the drain time is up is dropped.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_io_timeout::TimeoutStream;
use tower::{Service, ServiceExt};

use crate::server::error::ApiError;
use crate::server::http::body_guard::{guard_body, BodyEnd};

/// Most headers a request may carry; past it a 431 with a JSON body. hyper
/// parses up to four times as many (a few bytes of index each), and past
/// that answers a bare 431 itself.
const MAX_HEADERS: usize = 256;

/// How long a request body may have been arriving before its connection
/// may be closed to make room for a new one at the cap.
const SLOW_UPLOAD: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// Longest wait for a request head, and longest stall of a write.
    pub client_timeout: Duration,
    /// Request line plus headers; beyond it, a 431 in OpenAI's error shape.
    pub max_header_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Close {
    Open,
    /// Finish the request in progress, then close (graceful shutdown).
    AfterResponse,
    Now,
}

struct Conn {
    /// Requests in progress: from their head until their response body is gone.
    active: Arc<AtomicUsize>,
    /// While a request body is arriving: when it began ([`Clock`]); else 0.
    uploading: Arc<AtomicU64>,
    close: watch::Sender<Close>,
}

/// Milliseconds since the server started, plus one (0 means "not set").
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> u64 {
        self.0.elapsed().as_millis() as u64 + 1
    }
}

/// Open connections by age: ids grow with each accept.
type Registry = Arc<Mutex<BTreeMap<u64, Conn>>>;

fn lock(registry: &Registry) -> std::sync::MutexGuard<'_, BTreeMap<u64, Conn>> {
    // Entries are plain handles; one left mid-update by a panic is still valid.
    registry.lock().unwrap_or_else(|e| e.into_inner())
}

/// Closes the oldest connection with no request in progress, else the one
/// sending a body for longest past [`SLOW_UPLOAD`]; false if there is none.
fn evict_idle(registry: &Registry, clock: Clock) -> bool {
    let mut conns = lock(registry);
    let idle = conns
        .iter()
        .find(|(_, c)| c.active.load(Ordering::Acquire) == 0)
        .map(|(&id, _)| id);
    let slow = || {
        let cutoff = clock.now().checked_sub(SLOW_UPLOAD.as_millis() as u64)?;
        conns
            .iter()
            .map(|(&id, c)| (c.uploading.load(Ordering::Acquire), id))
            .filter(|&(since, _)| since != 0 && since <= cutoff)
            .min()
            .map(|(_, id)| id)
    };
    match idle.or_else(slow).and_then(|id| conns.remove(&id)) {
        Some(conn) => {
            let _ = conn.close.send(Close::Now);
            true
        }
        None => false,
    }
}

/// Serves `app` until `shutdown` resolves, then drains open connections for
/// at most `drain`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let registry = Registry::default();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.client_timeout)
        // Headers a little past the limit still reach the 431 check with a
        // JSON body; far past it hyper answers a bare 431 itself.
        .max_buf_size((4 * limits.max_header_bytes).max(8192))
        .max_headers(4 * MAX_HEADERS);
    let refusal = refusal_response();
    let clock = Clock(Instant::now());
    let mut next_id = 0u64;
    let mut last_accept_warning: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, most likely: make room and don't spin.
                evict_idle(&registry, clock);
                if last_accept_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                    tracing::warn!("accept failed: {e}");
                    last_accept_warning = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if lock(&registry).len() >= limits.max_connections && !evict_idle(&registry, clock) {
            // The send buffer of a new socket is empty, so this never blocks.
            let _ = stream.try_write(&refusal);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let (close, close_rx) = watch::channel(Close::Open);
        let active = Arc::new(AtomicUsize::new(0));
        let uploading = Arc::new(AtomicU64::new(0));
        next_id += 1;
        lock(&registry).insert(
            next_id,
            Conn {
                active: active.clone(),
                uploading: uploading.clone(),
                close,
            },
        );
        let service = ConnService {
            app: app.clone(),
            active,
            uploading,
            clock,
            max_header_bytes: limits.max_header_bytes,
        };
        tokio::spawn(run_connection(
            stream,
            http.clone(),
            service,
            close_rx,
            limits.client_timeout,
            (registry.clone(), next_id),
        ));
    }
    drop(listener);
    for conn in lock(&registry).values() {
        let idle = conn.active.load(Ordering::Acquire) == 0;
        let _ = conn.close.send(if idle {
            Close::Now
        } else {
            Close::AfterResponse
        });
    }
    let deadline = Instant::now() + drain;
    while !lock(&registry).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Dropping the handles closes whatever is left.
    lock(&registry).clear();
}

async fn run_connection(
    stream: TcpStream,
    http: hyper::server::conn::http1::Builder,
    service: ConnService,
    mut close: watch::Receiver<Close>,
    client_timeout: Duration,
    (registry, id): (Registry, u64),
) {
    let mut io = TimeoutStream::new(stream);
    io.set_write_timeout(Some(client_timeout));
    let conn = http.serve_connection(
        TokioIo::new(Box::pin(io)),
        TowerToHyperService::new(service),
    );
    tokio::pin!(conn);
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            changed = close.changed() => match changed.map(|()| *close.borrow()) {
                Ok(Close::Open) => {}
                Ok(Close::AfterResponse) => conn.as_mut().graceful_shutdown(),
                // Evicted, or the drain time is up.
                Ok(Close::Now) | Err(_) => break,
            },
        }
    }
    lock(&registry).remove(&id);
}

/// What a new connection gets when every slot is busy.
fn refusal_response() -> Vec<u8> {
    let body =
        ApiError::unavailable("The server has too many open connections. Retry later.").sse_data();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The router, per connection: counts the connection's requests in progress
/// and refuses oversized headers.
#[derive(Clone)]
struct ConnService {
    app: Router,
    active: Arc<AtomicUsize>,
    uploading: Arc<AtomicU64>,
    clock: Clock,
    max_header_bytes: usize,
}

/// A request body still arriving on its connection, until it is read or
/// dropped.
struct Uploading(Arc<AtomicU64>);

impl BodyEnd for Uploading {
    fn body_dropped(&mut self, _complete: bool) {
        self.0.store(0, Ordering::Release);
    }
}

/// One request in progress on its connection, until its response body is gone.
struct Active(Arc<AtomicUsize>);

impl Active {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Active(count)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl BodyEnd for Active {
    fn body_dropped(&mut self, _complete: bool) {}
}

fn header_bytes(req: &Request<Incoming>) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + 12;
    line + req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>()
}

impl Service<Request<Incoming>> for ConnService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let refused = if req.headers().len() > MAX_HEADERS {
            Some(ApiError::too_many_headers(MAX_HEADERS))
        } else if header_bytes(&req) > self.max_header_bytes {
            Some(ApiError::headers_too_large(self.max_header_bytes))
        } else {
            None
        };
        if let Some(refused) = refused {
            return Box::pin(std::future::ready(Ok(refused.into_response())));
        }
        let active = Active::new(self.active.clone());
        let req = match http_body::Body::is_end_stream(req.body()) {
            true => req.map(Body::new),
            false => {
                self.uploading.store(self.clock.now(), Ordering::Release);
                let guard = Uploading(self.uploading.clone());
                req.map(|b| guard_body(Body::new(b), guard))
            }
        };
        let response = self.app.clone().oneshot(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| guard_body(body, active)))
        })
    }
}
