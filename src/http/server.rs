//! The HTTP server: accepts TCP connections and serves the router on each one (HTTP/1.1, with
//! upgrades for the WebSockets), with the bounds an open network needs.
//!
//! What it owns and its invariants:
//! - **At most `max_connections` open connections** (upgraded WebSockets included: a slot is held
//!   by the socket itself and freed when it closes). When a new connection arrives at the limit,
//!   the oldest connection still speaking HTTP is asked to close (at once if it is idle or still
//!   sending its request head, after its answer otherwise): a flood of idle or slow connections
//!   can never lock new clients out. Only when nothing can be asked to close (every slot is a
//!   WebSocket) is the new connection refused (closed at once). An evicted connection closes on
//!   its own task; while 32 of them are still open past the limit, no connection is accepted
//!   (they wait in the kernel's backlog), so a flood never takes more descriptors than the
//!   limit, those 32 and the process's own.
//! - **Every connection makes progress or goes**: a request head (counted from the connection's
//!   start or the previous answer, so it also bounds an idle keep-alive connection) must arrive
//!   within `header_timeout`; one write to a client may stay blocked at most `write_timeout`.
//!   Request bodies have their own total deadline where they are read (`http::body`).
//! - **Shutdown**: once `shutdown` is cancelled no connection is accepted; every connection is
//!   asked to close after its current answer; `serve` returns when all have closed. Dropping the
//!   future aborts whatever is still open.
//!
//! Metrics: `geodwell_http_connections` (open now), `geodwell_http_connections_accepted_total`,
//! `_evicted_total`, `_refused_total`, `geodwell_http_accept_errors_total`,
//! `geodwell_http_timeouts_total{kind}` (`header`, `write`).

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics::{counter, gauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::telemetry as t;

/// The bounds of [`serve`] (`[server]` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most open connections.
    pub max_connections: usize,
    /// Longest wait for a request head (from the connection's start or the previous answer).
    pub header_timeout: Duration,
    /// Longest time one write to a client may stay blocked.
    pub write_timeout: Duration,
}

/// Serves `router` on `listener` within `limits` until `shutdown` is cancelled and every
/// connection has closed (see the module docs); over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    tls: Option<Arc<super::tls::Tls>>,
    shutdown: CancellationToken,
) {
    let open = Arc::new(Slots::default());
    let http = Arc::new(Mutex::new(BTreeMap::<u64, Arc<ConnCtl>>::new()));
    let mut conns = JoinSet::new();
    let mut next_id = 0u64;
    gauge!(t::HTTP_CONNECTIONS).set(0.0);
    loop {
        // An evicted connection closes on its own task: accept no more while too many of them
        // still hold a descriptor (they live on the open-files reserve meanwhile), so that a
        // flood on a busy machine cannot run the process out of descriptors.
        let crowded = open.open() >= limits.max_connections + EVICTING;
        let accepted = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            _ = open.freed.notified(), if crowded => continue,
            a = listener.accept(), if !crowded => a,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // EMFILE and the like: the process is out of a resource; give it a moment
                // rather than spinning on the same error.
                counter!(t::HTTP_ACCEPT_ERRORS).increment(1);
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if open.open() >= limits.max_connections {
            let evicted = {
                let mut http = http.lock().unwrap_or_else(|p| p.into_inner());
                evict(&mut http)
            };
            if evicted {
                counter!(t::HTTP_CONNECTIONS_EVICTED).increment(1);
            } else {
                counter!(t::HTTP_CONNECTIONS_REFUSED).increment(1);
                drop(tcp);
                continue;
            }
        }
        counter!(t::HTTP_CONNECTIONS_ACCEPTED).increment(1);
        let _ = tcp.set_nodelay(true);
        let io = Conn::new(tcp, limits.write_timeout, Slot::take(&open));
        let id = next_id;
        next_id += 1;
        let ctl = Arc::new(ConnCtl {
            active: AtomicUsize::new(0),
            close: shutdown.child_token(),
            kill: CancellationToken::new(),
        });
        http.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, ctl.clone());
        let registry = http.clone();
        let router = router.clone();
        let header_timeout = limits.header_timeout;
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        conns.spawn(async move {
            match acceptor {
                None => serve_connection(io, router, header_timeout, ctl).await,
                Some(acceptor) => {
                    // The handshake is bounded like a request head, in this task.
                    match tokio::time::timeout(header_timeout, acceptor.accept(io)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, router, header_timeout, ctl).await
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => {
                            counter!(t::HTTP_TIMEOUTS, "kind" => "header").increment(1);
                        }
                    }
                }
            }
            registry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }
    // Shutdown: every connection's token is a child of `shutdown`, so each is closing already.
    while conns.join_next().await.is_some() {}
}

/// How the accept loop reaches one connection that still speaks HTTP.
#[derive(Debug)]
struct ConnCtl {
    /// Requests being answered (until the answer's body is written or dropped).
    active: AtomicUsize,
    /// Close after the current answer (shutdown, or eviction of a busy connection).
    close: CancellationToken,
    /// Close now (eviction of a connection with no request in flight: idle, or still sending
    /// its first request head).
    kill: CancellationToken,
}

/// Connections asked to close and not closed yet, at most, before the accept loop waits.
const EVICTING: usize = 32;

/// How many of the oldest connections eviction looks at for one with nothing in flight.
const EVICTION_SCAN: usize = 64;

/// Makes room for one connection: closes the oldest of the first [`EVICTION_SCAN`] connections
/// that has no request in flight at once, or else asks the oldest to close after its answer.
/// False when there is no HTTP connection to ask (every slot is a WebSocket).
fn evict(http: &mut BTreeMap<u64, Arc<ConnCtl>>) -> bool {
    let idle = http
        .iter()
        .take(EVICTION_SCAN)
        .find(|(_, c)| c.active.load(Ordering::Relaxed) == 0)
        .map(|(id, _)| *id);
    if let Some(id) = idle.and_then(|id| http.remove(&id)) {
        id.kill.cancel();
        return true;
    }
    match http.pop_first() {
        Some((_, c)) => {
            c.close.cancel();
            true
        }
        None => false,
    }
}

/// Holds one request of a connection in flight until dropped (with the answer's body).
struct InFlight(Arc<ConnCtl>);

impl InFlight {
    fn enter(ctl: &Arc<ConnCtl>) -> InFlight {
        ctl.active.fetch_add(1, Ordering::Relaxed);
        InFlight(ctl.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body that keeps its request counted as in flight until it is written or dropped.
struct Counted {
    body: axum::body::Body,
    _in_flight: InFlight,
}

impl http_body::Body for Counted {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The most a connection's read buffer holds (headers must fit in it too).
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Serves one connection until it ends: gracefully (after the current answer) once
/// `ctl.close` is cancelled, at once once `ctl.kill` is.
async fn serve_connection<I>(io: I, router: Router, header_timeout: Duration, ctl: Arc<ConnCtl>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let counting = ctl.clone();
    let service = TowerToHyperService::new(tower::service_fn(move |req: Request<Incoming>| {
        let in_flight = InFlight::enter(&counting);
        let router = router.clone();
        async move {
            let resp = router.oneshot(req.map(axum::body::Body::new)).await?;
            Ok::<_, std::convert::Infallible>(resp.map(|body| {
                axum::body::Body::new(Counted {
                    body,
                    _in_flight: in_flight,
                })
            }))
        }
    }));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        // A connection's read buffer is at most this (hyper's default is about 400 kB): with
        // thousands of connections sending bodies at once, the buffers alone would otherwise
        // hold more than the memory budget that bounds the bodies themselves.
        .max_buf_size(READ_BUFFER_BYTES)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = ctl.kill.cancelled() => return,
        _ = ctl.close.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => r,
                _ = ctl.kill.cancelled() => return,
            }
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            counter!(t::HTTP_TIMEOUTS, "kind" => "header").increment(1);
        } else if is_write_timeout(&e) {
            counter!(t::HTTP_TIMEOUTS, "kind" => "write").increment(1);
        }
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Whether a connection error is a write that stayed blocked past `write_timeout`.
fn is_write_timeout(e: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::TimedOut;
        }
        source = s.source();
    }
    false
}

/// One connection slot, held by the socket for as long as it is open (an upgraded WebSocket
/// included); freed on drop.
#[derive(Debug)]
struct Slot(Arc<Slots>);

/// The open connections' count, and a wake-up for the accept loop when one closes.
#[derive(Debug, Default)]
struct Slots {
    open: AtomicUsize,
    freed: tokio::sync::Notify,
}

impl Slots {
    fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

impl Slot {
    fn take(slots: &Arc<Slots>) -> Slot {
        let n = slots.open.fetch_add(1, Ordering::Relaxed) + 1;
        gauge!(t::HTTP_CONNECTIONS).set(n as f64);
        Slot(slots.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let n = self.0.open.fetch_sub(1, Ordering::Relaxed) - 1;
        gauge!(t::HTTP_CONNECTIONS).set(n as f64);
        self.0.freed.notify_one();
    }
}

/// A client socket whose writes time out, carrying its connection slot.
#[derive(Debug)]
struct Conn {
    stream: Pin<Box<TimeoutStream<TcpStream>>>,
    _slot: Slot,
}

impl Conn {
    fn new(tcp: TcpStream, write_timeout: Duration, slot: Slot) -> Conn {
        let mut stream = TimeoutStream::new(tcp);
        stream.set_write_timeout(Some(write_timeout));
        Conn {
            stream: Box::pin(stream),
            _slot: slot,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream.as_mut().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.stream.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream.as_mut().poll_shutdown(cx)
    }
}
