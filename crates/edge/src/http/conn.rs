//! Connections of the HTTP server, bounded so slow or never-reading clients cannot hold the
//! edge: request headers must arrive within a deadline, a request body within another
//! (`body_deadline`), a response write that makes no progress for a while ends the connection
//! (a reader that stalls a stream), each peer address holds a bounded number of connections and
//! the server a bounded total, and the allocator's free memory is handed back to the system as
//! connections go.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::ServiceExt;

use super::ApiError;

/// The peer address of a request's connection (an extension on every request): whose
/// request it is, for fair shares of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// The bounds of the server's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Until a request's headers are in (and between requests on a kept-alive connection).
    pub headers: Duration,
    /// Until a request's body is in whole, from its headers.
    pub body: Duration,
    /// How long a write may make no progress (the client reads nothing) before the
    /// connection ends.
    pub write_stall: Duration,
    /// Connections one peer address may hold at once (more are closed at once).
    pub per_peer: usize,
    /// Connections the server holds at once.
    pub total: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            headers: Duration::from_secs(10),
            body: Duration::from_secs(30),
            write_stall: Duration::from_secs(30),
            per_peer: 64,
            total: 1024,
        }
    }
}

/// Open connections, by peer address and in all.
#[derive(Default)]
struct Open {
    by_peer: HashMap<IpAddr, usize>,
    total: usize,
}

/// One connection's place in `Open`, given back on drop.
struct Slot {
    open: Arc<Mutex<Open>>,
    peer: IpAddr,
}

impl Slot {
    fn take(open: &Arc<Mutex<Open>>, peer: IpAddr, limits: &ConnLimits) -> Option<Self> {
        let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
        let n = o.by_peer.get(&peer).copied().unwrap_or(0);
        if n >= limits.per_peer || o.total >= limits.total {
            return None;
        }
        o.by_peer.insert(peer, n + 1);
        o.total += 1;
        Some(Self {
            open: open.clone(),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.open.lock().unwrap_or_else(|p| p.into_inner());
        o.total -= 1;
        match o.by_peer.get_mut(&self.peer) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                o.by_peer.remove(&self.peer);
            }
        }
    }
}

/// Serve `app` on `listener` until `stop` resolves, then let open connections finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnLimits,
    stop: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let open = Arc::new(Mutex::new(Open::default()));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let trim = Arc::new(Mutex::new(Instant::now()));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.headers);
    let builder = Arc::new(builder);
    let mut stop = std::pin::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            got = listener.accept() => match got {
                Ok(x) => x,
                // Out of descriptors or a connection reset before it was taken: the next
                // accept may succeed.
                Err(e) if transient(&e) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            },
            () = &mut stop => break,
        };
        let Some(slot) = Slot::take(&open, peer.ip(), &limits) else {
            tracing::debug!("refused a connection from {}: too many open", peer.ip());
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let io = TokioIo::new(Stalls::new(tcp, limits.write_stall));
        let client = ClientAddr(peer.ip());
        let svc = hyper_util::service::TowerToHyperService::new(app.clone().map_request(
            move |r: hyper::Request<Incoming>| {
                let mut r = r.map(Body::new);
                r.extensions_mut().insert(client);
                r
            },
        ));
        let conn = builder.serve_connection_with_upgrades(io, svc).into_owned();
        let conn = graceful.watch(conn);
        let trim = trim.clone();
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
            give_back_memory(&trim);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || e
        .raw_os_error()
        .is_some_and(|c| c == libc::EMFILE || c == libc::ENFILE)
}

/// At most once a second, on a blocking thread: what closed connections freed goes back to
/// the system (glibc keeps it otherwise, and a flood would leave the process swollen).
fn give_back_memory(last: &Mutex<Instant>) {
    {
        let mut at = last.lock().unwrap_or_else(|p| p.into_inner());
        if at.elapsed() < Duration::from_secs(1) {
            return;
        }
        *at = Instant::now();
    }
    tokio::task::spawn_blocking(super::give_back_memory);
}

/// The request body read whole within `within`, else 408. A body whose declared length is
/// over `max` (the largest any route takes) goes on unread, for its route to refuse; one
/// without a declared length is read up to `max` only (then 413). Each route's own limit still
/// applies after.
pub async fn body_deadline(
    axum::extract::State(limits): axum::extract::State<(Duration, usize)>,
    req: Request,
    next: Next,
) -> Response {
    let (within, max) = limits;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let read = async {
        use tokio_stream::StreamExt;
        let mut data = body.into_data_stream();
        let mut all = Vec::new();
        while let Some(chunk) = data.next().await {
            let chunk = chunk
                .map_err(|_| ApiError::bad_request("the request body broke off before its end"))?;
            if all.len() + chunk.len() > max {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body is larger than this endpoint takes (more than the \
                     model's context could hold)",
                ));
            }
            all.extend_from_slice(&chunk);
        }
        Ok(all)
    };
    match tokio::time::timeout(within, read).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => e.into_response(),
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                within.as_secs()
            ),
        )
        .into_response(),
    }
}

/// A connection whose writes fail once one has made no progress for `stall`.
struct Stalls<T> {
    inner: T,
    stall: Duration,
    since: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Stalls<T> {
    fn new(inner: T, stall: Duration) -> Self {
        Self {
            inner,
            stall,
            since: None,
        }
    }

    /// A write that is pending: pending still, or an error once it has been for `stall`.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let stall = self.stall;
        let timer = self
            .since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stalls<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stalls<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.pending(cx),
            done => {
                self.since = None;
                done
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.pending(cx),
            done => {
                self.since = None;
                done
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.pending(cx),
            done => {
                self.since = None;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_write_nobody_reads_fails_after_the_stall_and_one_read_restarts_it() {
        let (near, far) = tokio::io::duplex(64);
        let mut w = Stalls::new(near, Duration::from_millis(300));
        // 64 bytes fit the pipe; the next write waits on a reader that never reads.
        w.write_all(&[1; 64]).await.unwrap();
        let e = w.write_all(&[2; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // A reader that reads in time keeps the connection: each write that progresses
        // starts the wait anew.
        let (near, mut far2) = tokio::io::duplex(64);
        let mut w = Stalls::new(near, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0; 64];
            let mut got = 0;
            while got < 640 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                got += far2.read(&mut buf).await.unwrap();
            }
            got
        });
        for _ in 0..10 {
            w.write_all(&[3; 64]).await.unwrap();
        }
        assert_eq!(reader.await.unwrap(), 640);
        drop(far);
    }

    #[test]
    fn a_peer_holds_at_most_its_share_and_gives_it_back() {
        let open = Arc::new(Mutex::new(Open::default()));
        let limits = ConnLimits {
            per_peer: 2,
            total: 3,
            ..Default::default()
        };
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let a1 = Slot::take(&open, a, &limits).unwrap();
        let _a2 = Slot::take(&open, a, &limits).unwrap();
        assert!(
            Slot::take(&open, a, &limits).is_none(),
            "a third from one peer"
        );
        let _b1 = Slot::take(&open, b, &limits).unwrap();
        assert!(Slot::take(&open, b, &limits).is_none(), "past the total");
        drop(a1);
        assert!(Slot::take(&open, b, &limits).is_some(), "given back");
    }
}
