//! An HTTP metadata server that upstream Mooncake engines can use instead
//! of etcd or upstream's Python server (`mooncake_http_metadata_server`),
//! given as `http://HOST:PORT/metadata`: the same requests get the same
//! answers, plus caps and timeouts that make it safe to expose.
//!
//! The protocol, as upstream's engines and Python server speak it:
//!
//! | request                                | answer                                   |
//! |----------------------------------------|------------------------------------------|
//! | any method, no or blank `key`          | 400 `metadata key is required`           |
//! | `GET /metadata?key=K`, K stored        | 200, the stored value (`application/json`) |
//! | `GET /metadata?key=K`, K not stored    | 404 `metadata not found`                 |
//! | `PUT /metadata?key=K` + body           | 200 `metadata updated` (body stored as sent) |
//! | `PUT` of an existing key containing `rpc_meta` | 400 `Duplicate rpc_meta key not allowed` |
//! | `DELETE /metadata?key=K`, K stored     | 200 `metadata deleted`                   |
//! | `DELETE /metadata?key=K`, K not stored | 404 `metadata not found`                 |
//! | another method on `/metadata`          | 405 `Method not allowed`                 |
//! | another path                           | 404 `404: Not Found` (`text/plain`)      |
//!
//! Keys are percent-decoded (`+` is a space) and stripped of surrounding
//! whitespace; the first `key` parameter counts. Text answers on
//! `/metadata` carry `Content-Type: application/json; charset=utf-8`, as
//! upstream's do. Beyond upstream: `GET /health` answers 200 `OK` (as
//! upstream's C++ metadata server does), and the caps of [`Config`] answer
//! 413 (body too large: aiohttp's `text/plain` answer, as upstream), 414 (key too long), 503 (too many request bodies
//! in flight: retry later) or 507 (store full); connections over the
//! per-address cap are closed at once, and answers must go out within the
//! request timeout.
//!
//! [`serve`] runs the server; the `mooncake-metadata-server` binary wraps
//! it with flags and signal handling.

pub mod store;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

pub use store::{Limits, PutError, Store};

/// The path upstream's engines and server use.
pub const METADATA_PATH: &str = "/metadata";

/// How the server behaves; [`Config::default`] is compatible with upstream
/// and generous enough for any cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Caps on keys and stored bytes.
    pub limits: Limits,
    /// The largest request body accepted (default 1 MiB, as aiohttp's
    /// default `client_max_size` upstream).
    pub max_body_bytes: usize,
    /// Request body bytes held at once by all connections together (default
    /// 64 MiB): a body that does not fit is answered 503. Declared bodies
    /// count in full from the start, chunked ones as they grow.
    pub max_inflight_body_bytes: usize,
    /// Let a PUT replace an existing `rpc_meta` key, so that an engine that
    /// crashed can restart under the same segment name. Off by default:
    /// upstream refuses (400 `Duplicate rpc_meta key not allowed`).
    pub allow_rpc_meta_overwrite: bool,
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Connections served at once from one client address (default 128);
    /// one more is closed as soon as it is accepted.
    pub max_connections_per_ip: usize,
    /// A connection with no request under way, or whose reader or writer
    /// makes no progress, is closed after this long.
    pub idle_timeout: Duration,
    /// From its first byte, a request (headers and body) must arrive within
    /// this long, or its connection is closed; likewise an answer, from its
    /// first byte, must be written out (to a reader however slow) within
    /// this long.
    pub request_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            max_body_bytes: 1 << 20,
            max_inflight_body_bytes: 64 << 20,
            allow_rpc_meta_overwrite: false,
            max_connections: 1024,
            max_connections_per_ip: 128,
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves the metadata protocol on `listener` until `shutdown` completes;
/// then stops accepting, lets requests under way finish (each is bounded
/// by [`Config::request_timeout`]) and returns.
pub async fn serve<F>(listener: TcpListener, config: Config, shutdown: F) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let listener = TimedListener {
        inner: listener,
        permits: Arc::new(Semaphore::new(permits(config.max_connections))),
        per_ip: Arc::new(PerIp {
            counts: Mutex::new(HashMap::new()),
            max: config.max_connections_per_ip.max(1),
        }),
        refusals: Throttle::new(),
        idle: config.idle_timeout,
        request: config.request_timeout,
    };
    axum::serve(listener, router(&config))
        .with_graceful_shutdown(shutdown)
        .await
}

/// The request handling alone, as an axum [`Router`] with its own empty
/// store (for embedding in another server; [`serve`] adds the connection
/// limits and timeouts).
pub fn router(config: &Config) -> Router {
    let inflight = permits(config.max_inflight_body_bytes);
    let app = Arc::new(App {
        store: Mutex::new(Store::new(config.limits, config.allow_rpc_meta_overwrite)),
        max_body_bytes: config.max_body_bytes,
        inflight: Arc::new(Semaphore::new(inflight)),
        inflight_limit: inflight,
        refusals: Throttle::new(),
    });
    Router::new().fallback(handle).with_state(app)
}

/// A semaphore size in `1..=Semaphore::MAX_PERMITS` (more would panic).
fn permits(n: usize) -> usize {
    n.clamp(1, Semaphore::MAX_PERMITS)
}

/// `now + d`, saturating at about 30 years from now rather than
/// overflowing.
fn deadline(d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 86_400);
    let now = Instant::now();
    now.checked_add(d.min(FAR)).unwrap_or(now)
}

/// At most [`LOG_KEY_CHARS`] characters of `key`, for logs (keys may be
/// long, and come from clients).
fn log_key(key: &str) -> String {
    match key.char_indices().nth(LOG_KEY_CHARS) {
        Some((at, _)) => format!("{}... ({} bytes)", &key[..at], key.len()),
        None => key.to_owned(),
    }
}

const LOG_KEY_CHARS: usize = 128;

/// Lets a kind of client-caused log line through at most once per
/// [`Throttle::EVERY`], counting the ones held back.
struct Throttle {
    next: Mutex<Option<std::time::Instant>>,
    held_back: AtomicU64,
}

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    fn new() -> Self {
        Self {
            next: Mutex::new(None),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` when a line may go out.
    fn allow(&self) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_some_and(|n| now < n) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *next = now.checked_add(Self::EVERY);
        Some(self.held_back.swap(0, Ordering::Relaxed))
    }
}

struct App {
    store: Mutex<Store>,
    max_body_bytes: usize,
    /// Request body bytes that may still be taken in (in flight, not yet
    /// stored or dropped).
    inflight: Arc<Semaphore>,
    inflight_limit: usize,
    refusals: Throttle,
}

impl App {
    fn store(&self) -> MutexGuard<'_, Store> {
        // The store stays consistent under any panic (none is expected).
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs a refused PUT: a warning at most every [`Throttle::EVERY`],
    /// the others at debug level.
    fn refused(&self, key: &str, why: &dyn std::fmt::Display) {
        let key = log_key(key);
        match self.refusals.allow() {
            Some(held_back) => {
                tracing::warn!(key, held_back, "metadata PUT refused: {why}")
            }
            None => tracing::debug!(key, "metadata PUT refused: {why}"),
        }
    }

    /// `n` more body bytes in flight, or `None` when the budget has no
    /// room for them.
    fn reserve(&self, n: usize) -> Option<Option<OwnedSemaphorePermit>> {
        if n == 0 {
            return Some(None);
        }
        let n = u32::try_from(n).ok()?;
        self.inflight
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(Some)
    }
}

const JSON_TEXT: &str = "application/json; charset=utf-8";
const JSON: &str = "application/json";
const PLAIN_TEXT: &str = "text/plain; charset=utf-8";

fn answer(status: StatusCode, content_type: &'static str, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    answer(status, JSON_TEXT, body.into())
}

async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let path = decode(req.uri().path(), false);
    if path == "/health" && req.method() == Method::GET {
        return answer(StatusCode::OK, PLAIN_TEXT, "OK");
    }
    if path != METADATA_PATH {
        return answer(StatusCode::NOT_FOUND, PLAIN_TEXT, "404: Not Found");
    }
    let raw_key = req.uri().query().and_then(query_key).unwrap_or_default();
    let key = store::strip_key(&raw_key);
    let method = req.method().clone();
    let declared_len = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if key.is_empty() {
        return text(StatusCode::BAD_REQUEST, "metadata key is required");
    }
    let resp = match method {
        Method::GET => match app.store().get(key) {
            Some(v) => answer(StatusCode::OK, JSON, v),
            None => text(StatusCode::NOT_FOUND, "metadata not found"),
        },
        Method::PUT => put(&app, key, declared_len, req.into_body()).await,
        Method::DELETE => {
            if app.store().delete(key) {
                text(StatusCode::OK, "metadata deleted")
            } else {
                text(StatusCode::NOT_FOUND, "metadata not found")
            }
        }
        _ => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, PUT, DELETE"));
            r
        }
    };
    tracing::debug!(%method, key = log_key(key), status = resp.status().as_u16(), "metadata request");
    resp
}

async fn put(app: &App, key: &str, declared_len: Option<u64>, body: Body) -> Response {
    let max = app.max_body_bytes;
    let too_large = || {
        // aiohttp's answer upstream, word for word.
        let e = format!("Maximum request body size {max} exceeded.");
        app.refused(key, &e);
        answer(StatusCode::PAYLOAD_TOO_LARGE, PLAIN_TEXT, e)
    };
    let busy = || {
        let e = format!(
            "server busy: request bodies in flight would exceed the limit of {} bytes; retry later",
            app.inflight_limit
        );
        app.refused(key, &e);
        text(StatusCode::SERVICE_UNAVAILABLE, e)
    };
    // Refused before the body is read (no 100 Continue goes out).
    let declared = match declared_len {
        Some(n) if n > max as u64 => return too_large(),
        Some(n) => Some(n as usize),
        None => None,
    };
    let limits = app.store().limits();
    if key.len() > limits.max_key_bytes {
        let e = PutError::KeyTooLong {
            len: key.len(),
            max: limits.max_key_bytes,
        };
        app.refused(key, &e);
        return text(StatusCode::URI_TOO_LONG, e.to_string());
    }
    // A declared body counts in full before it is read, and is read into
    // a buffer of exactly its size; a chunked one counts what its buffer
    // holds as it grows. Every path out releases what was counted.
    let (mut held, mut data) = match declared {
        Some(n) => match app.reserve(n) {
            Some(p) => (p, Vec::with_capacity(n)),
            None => return busy(),
        },
        None => (None, Vec::new()),
    };
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let c = match chunk {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(
                    key = log_key(key),
                    "metadata PUT: reading the body failed: {e}"
                );
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("failed to read the request body: {e}"),
                );
            }
        };
        let need = data.len() + c.len();
        if need > max {
            return too_large();
        }
        if need > data.capacity() {
            let cap = need.max(data.capacity().saturating_mul(2)).min(max);
            match app.reserve(cap - data.capacity()) {
                Some(Some(p)) => match held.as_mut() {
                    Some(h) => h.merge(p),
                    None => held = Some(p),
                },
                Some(None) => {}
                None => return busy(),
            }
            data.reserve_exact(cap - data.len());
        }
        data.extend_from_slice(&c);
    }
    // Stored values hold exactly their bytes, no spare capacity.
    data.shrink_to_fit();
    let result = app.store().put(key, Bytes::from(data));
    drop(held);
    match result {
        Ok(()) => text(StatusCode::OK, "metadata updated"),
        Err(e @ PutError::DuplicateRpcMeta) => text(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ PutError::KeyTooLong { .. }) => text(StatusCode::URI_TOO_LONG, e.to_string()),
        Err(e) => {
            app.refused(key, &e);
            text(StatusCode::INSUFFICIENT_STORAGE, e.to_string())
        }
    }
}

/// The first `key` parameter of a query string, decoded as upstream's
/// server (aiohttp/yarl) decodes it: split on `&`, `+` is a space, `%XX`
/// escapes decoded (malformed ones kept as they are), and invalid UTF-8
/// replaced by U+FFFD.
pub fn query_key(query: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(name, true) == "key").then(|| decode(value, true))
    })
}

/// Percent-decodes `s` (and `+` to a space where `plus` is set).
fn decode(s: &str, plus: bool) -> String {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let src = s.as_bytes();
    let mut out = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        match src[i] {
            b'%' => {
                let pair = src
                    .get(i + 1)
                    .copied()
                    .and_then(hex)
                    .zip(src.get(i + 2).copied().and_then(hex));
                match pair {
                    Some((hi, lo)) => {
                        out.push(hi << 4 | lo);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Accepts connections up to the connection cap and the per-address cap,
/// and wraps each in [`TimedStream`].
struct TimedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    per_ip: Arc<PerIp>,
    refusals: Throttle,
    idle: Duration,
    request: Duration,
}

/// Connections open per client address.
struct PerIp {
    counts: Mutex<HashMap<IpAddr, usize>>,
    max: usize,
}

impl PerIp {
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            per_ip: self.clone(),
            ip,
        })
    }
}

/// One connection's place in its address's count, given back on drop.
struct IpSlot {
    per_ip: Arc<PerIp>,
    ip: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut counts = self.per_ip.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

impl axum::serve::Listener for TimedListener {
    type Io = TimedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed, so this always yields a permit.
        let permit = self.permits.clone().acquire_owned().await.ok();
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let Some(slot) = self.per_ip.take(addr.ip()) else {
                        // Closed at once (dropped), the permit kept.
                        if let Some(held_back) = self.refusals.allow() {
                            tracing::debug!(
                                ip = %addr.ip(),
                                limit = self.per_ip.max,
                                held_back,
                                "metadata server: connection refused: too many from this address"
                            );
                        }
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let io = TimedStream {
                        inner: stream,
                        timer: Box::pin(tokio::time::sleep_until(deadline(self.idle))),
                        idle: self.idle,
                        request: self.request,
                        phase: Phase::Idle,
                        _permit: permit,
                        _slot: slot,
                    };
                    return (io, addr);
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait, as axum's
                    // own listener does, rather than spin.
                    tracing::warn!("metadata server: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request: the idle timeout runs.
    Idle,
    /// A request is arriving: the request timeout runs from its first byte.
    Request,
    /// An answer is going out: the request timeout runs from its first
    /// byte, until everything written is flushed.
    Responding,
}

/// A TCP stream with deadlines. Waiting for a request, it fails with
/// `TimedOut` after the idle timeout; from the first byte of a request
/// until its answer starts going out, after the request timeout (so a
/// client trickling bytes cannot hold a connection for ever); and from the
/// first byte of an answer until it is all written, after the request
/// timeout again (so a client reading slowly cannot either, nor keep its
/// copy of a value alive).
struct TimedStream {
    inner: TcpStream,
    timer: Pin<Box<Sleep>>,
    idle: Duration,
    request: Duration,
    phase: Phase,
    _permit: Option<OwnedSemaphorePermit>,
    _slot: IpSlot,
}

impl TimedStream {
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.timer.as_mut().poll(cx).is_ready()
    }

    /// Past the deadline without polling the timer (for a peer that keeps
    /// making a little progress, so that no call returns `Pending`).
    fn past_deadline(&self) -> bool {
        self.phase != Phase::Idle && Instant::now() >= self.timer.deadline()
    }

    fn timed_out(&self) -> io::Error {
        let what = match self.phase {
            Phase::Idle => "idle timeout",
            Phase::Request => "request timeout",
            Phase::Responding => "response timeout (the client reads too slowly)",
        };
        io::Error::new(io::ErrorKind::TimedOut, what)
    }

    fn enter(&mut self, phase: Phase) {
        if self.phase == phase {
            return;
        }
        let at = match phase {
            Phase::Idle => deadline(self.idle),
            // Never later than an answer's deadline already running.
            Phase::Request if self.phase == Phase::Responding => {
                deadline(self.request).min(self.timer.deadline())
            }
            Phase::Request | Phase::Responding => deadline(self.request),
        };
        self.phase = phase;
        self.timer.as_mut().reset(at);
    }

    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.enter(Phase::Responding);
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(self.timed_out())),
            other => other,
        }
    }
}

impl AsyncRead for TimedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.phase == Phase::Request && this.past_deadline() {
            return Poll::Ready(Err(this.timed_out()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.enter(Phase::Request);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(this.timed_out())),
            other => other,
        }
    }
}

impl AsyncWrite for TimedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.phase == Phase::Responding && this.past_deadline() {
            return Poll::Ready(Err(this.timed_out()));
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after_write(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.phase == Phase::Responding && this.past_deadline() {
            return Poll::Ready(Err(this.timed_out()));
        }
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after_write(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            // Everything written has gone out (hyper flushes its own
            // buffer first): the answer is over.
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Responding {
                    this.enter(Phase::Idle);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(this.timed_out())),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding_matches_upstream() {
        let k = |q: &str| query_key(q);
        assert_eq!(
            k("key=mooncake%2Fram%2F127.0.0.1%3A1234").as_deref(),
            Some("mooncake/ram/127.0.0.1:1234")
        );
        assert_eq!(k("key=a+b%2Bc%26d%3Fe").as_deref(), Some("a b+c&d?e"));
        assert_eq!(k("x=1&key=first&key=second").as_deref(), Some("first"));
        assert_eq!(k("k%65y=v").as_deref(), Some("v"));
        assert_eq!(k("key").as_deref(), Some(""));
        assert_eq!(k("key=a;b").as_deref(), Some("a;b"));
        assert_eq!(k("KEY=a"), None);
        assert_eq!(k("").as_deref(), None);
        // Malformed escapes stay; invalid UTF-8 becomes U+FFFD.
        assert_eq!(k("key=%ZZ%2%").as_deref(), Some("%ZZ%2%"));
        assert_eq!(k("key=%FF").as_deref(), Some("\u{fffd}"));
        assert_eq!(k("key=%ff").as_deref(), Some("\u{fffd}"));
        assert_eq!(k("key=%E2%82").as_deref(), Some("\u{fffd}"));
        assert_eq!(k("key=%E2%82%AC").as_deref(), Some("\u{20ac}"));
        assert_eq!(decode("/%6Detadata", false), "/metadata");
        assert_eq!(decode("/a+b", false), "/a+b");
    }

    #[test]
    fn log_keys_are_truncated() {
        assert_eq!(log_key("short"), "short");
        let long = "\u{e9}".repeat(200);
        let k = log_key(&long);
        assert!(k.starts_with(&"\u{e9}".repeat(128)), "{k}");
        assert!(k.ends_with("... (400 bytes)"), "{k}");
        assert_eq!(k.chars().filter(|&c| c == '\u{e9}').count(), 128);
    }

    #[test]
    fn huge_settings_do_not_panic() {
        let far = deadline(Duration::MAX);
        assert!(far > Instant::now() + Duration::from_secs(86_400 * 365));
        assert_eq!(permits(usize::MAX), Semaphore::MAX_PERMITS);
        assert_eq!(permits(0), 1);
    }

    #[test]
    fn throttle_lets_one_line_through_per_period() {
        let t = Throttle::new();
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        assert_eq!(t.allow(), None);
        assert_eq!(t.held_back.load(Ordering::Relaxed), 2);
    }

    fn curl_escape(key: &str) -> String {
        key.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn encoded_keys_round_trip(key in "\\PC{0,40}") {
            let q = format!("a=1&key={}&key=x", curl_escape(&key));
            proptest::prop_assert_eq!(query_key(&q), Some(key));
        }

        #[test]
        fn any_query_decodes(q in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let q = String::from_utf8_lossy(&q);
            let _ = query_key(&q);
            let _ = decode(&q, false);
        }
    }
}
