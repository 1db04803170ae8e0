//! Slowloris protection for HTTP/1.1 with one timer per connection at most.
//!
//! hyper's own `header_read_timeout` drops and re-creates a boxed timer for every request and
//! also runs while a keep-alive connection waits for its next request, so it cost a timer
//! registration per review and closed idle connections at the header timeout instead of the idle
//! timeout. Here the clock starts when the first bytes of a request arrive (no request in flight)
//! and stops when hyper hands the request on; a timer is only set when a read finds the headers
//! still incomplete, which a well-behaved client (one write per request) never causes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::activity::Activity;

/// A stream that fails its reads once a request's headers take longer than `timeout`.
pub(super) struct HeaderDeadline<S> {
    inner: S,
    activity: Arc<Activity>,
    timeout: Duration,
    /// When the first bytes of the request being read arrived, and how many requests had started
    /// by then: once another starts, its headers are complete and the clock is stopped.
    clock: Option<(Instant, u64)>,
    /// Created the first time a client is slow, then reset; never on the fast path.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<S> HeaderDeadline<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>, timeout: Duration) -> Self {
        Self {
            inner,
            activity,
            timeout,
            clock: None,
            timer: None,
        }
    }

    /// The running clock's deadline, after dropping a clock whose request has started since.
    fn deadline(&mut self) -> Option<Instant> {
        let (since, started) = self.clock?;
        if self.activity.requests_started() != started {
            self.clock = None;
            return None;
        }
        Some(since + self.timeout)
    }

    /// Starts the clock when bytes arrive between requests.
    fn on_bytes(&mut self) {
        if self.deadline().is_none() && self.activity.in_flight() == 0 {
            self.clock = Some((Instant::now(), self.activity.requests_started()));
        }
    }

    /// With the clock running and no bytes to read: an error once the deadline has passed, else
    /// a wake-up registered for it.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(deadline) = self.deadline() else {
            return Poll::Pending;
        };
        let timer = match &mut self.timer {
            Some(timer) => {
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.clock = None;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the request headers did not arrive within {:?}",
                        self.timeout
                    ),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HeaderDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.on_bytes();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => this.poll_deadline(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeaderDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
