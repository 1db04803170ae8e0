//! Answers written together: the first write after each new request (an HTTP/1.1 request or an
//! h2 stream) waits once, until the connection's serving thread (`threads.rs`) has run out of
//! other ready tasks, so that the answers judged in one turn of the scheduler go out back to
//! back.
//!
//! Why: a write to a peer that sleeps wakes it, and on a virtual machine that wake (an
//! inter-processor interrupt) costs the writer several microseconds. Written one by one as each
//! review is judged, every answer finds a client with many connections (the apiservers, or a
//! load tester) asleep again; written in a burst, the first wakes it and the others find it
//! awake, and it sends its next requests in a burst too. How: the write returns `Pending` after
//! tokio's `yield_now` has deferred the task's wake-up; the runtime wakes deferred tasks when it
//! has no other ready task, after polling its event loop without blocking (a serving thread's
//! current-thread runtime; tokio's work-stealing workers, where the listener runs when no serving
//! thread could be started, first try to steal a task). hyper keeps the answer in its buffer
//! and writes it at the next poll. With one connection busy the wait is about one pass of an
//! idle scheduler. The wait is counted per request started: an interim `100
//! Continue` takes it, and the answer after it is then written at once.
//!
//! Measured with `benches/wrk_compare.py` (HTTP/1.1, 2 cores, 64 connections): 57-61% of
//! nginx's requests per second against 48-49% without, and less CPU per review. Over h2 with
//! `h2load` (4 connections of 16 streams): 51 000-53 000 reviews per second against 39 500-42 000
//! with HTTP/1.1 connections alone wrapped; one connection of 64 streams: the same. See
//! `benches/README.md`.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::Activity;

/// A stream whose first write after each new request waits for one turn of the scheduler.
pub(super) struct Coalesced<S> {
    inner: S,
    activity: Arc<Activity>,
    /// The request count at the last wait: one wait per request, never for bytes written
    /// before any request (a refused request line) or again while a write waits on the socket.
    waited_at: u64,
}

impl<S> Coalesced<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            waited_at: 0,
        }
    }

    /// Whether this write should first wait for a turn; if so the task is woken after the
    /// worker's other ready tasks (tokio's `yield_now`, deferred past them).
    fn wait_for_turn(&mut self, cx: &mut Context<'_>) -> bool {
        let started = self.activity.requests_started();
        if started == self.waited_at {
            return false;
        }
        self.waited_at = started;
        // A fresh `yield_now` is pending once, having asked to be woken after the other
        // ready tasks; dropping it afterwards keeps that wake.
        pin!(tokio::task::yield_now()).poll(cx).is_pending()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesced<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesced<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.wait_for_turn(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.wait_for_turn(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use tokio::io::AsyncWriteExt;

    use super::super::activity::InFlight;
    use super::*;

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn each_answer_waits_one_turn_and_is_then_written_whole() {
        let activity = Arc::new(Activity::new());
        let mut stream = Coalesced::new(Vec::<u8>::new(), Arc::clone(&activity));
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let woken = || wakes.0.load(Ordering::SeqCst);

        // Bytes before any request (an answer to a bad request line) go at once.
        let early = Pin::new(&mut stream).poll_write(&mut cx, b"early ");
        assert!(matches!(early, Poll::Ready(Ok(6))), "{early:?}");
        assert_eq!(woken(), 0);

        // An answer's first write waits for a turn, and its task is woken for the next (outside
        // a runtime: at once).
        drop(InFlight::start(Arc::clone(&activity)));
        assert!(
            Pin::new(&mut stream)
                .poll_write(&mut cx, b"one")
                .is_pending()
        );
        assert_eq!(woken(), 1, "a waiting write must wake its task");
        assert_eq!(stream.inner, b"early ", "nothing is written while waiting");
        // Then the answer is written, all its writes at once.
        let written = Pin::new(&mut stream).poll_write(&mut cx, b"one");
        assert!(matches!(written, Poll::Ready(Ok(3))), "{written:?}");
        let more = Pin::new(&mut stream).poll_write(&mut cx, b"+");
        assert!(matches!(more, Poll::Ready(Ok(1))), "{more:?}");
        assert_eq!(woken(), 1);

        // The next request's answer waits again, vectored writes too.
        drop(InFlight::start(Arc::clone(&activity)));
        let slices = [io::IoSlice::new(b" two")];
        assert!(
            Pin::new(&mut stream)
                .poll_write_vectored(&mut cx, &slices)
                .is_pending()
        );
        assert_eq!(woken(), 2);
        let written = Pin::new(&mut stream).poll_write_vectored(&mut cx, &slices);
        assert!(matches!(written, Poll::Ready(Ok(4))), "{written:?}");
        assert_eq!(stream.inner, b"early one+ two");
    }

    #[test]
    fn in_a_runtime_an_answer_is_written_after_the_other_ready_tasks() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let activity = Arc::new(Activity::new());
            let mut stream = Coalesced::new(Vec::<u8>::new(), Arc::clone(&activity));
            let log = Arc::new(Mutex::new(Vec::new()));
            let other = tokio::spawn({
                let log = Arc::clone(&log);
                async move { log.lock().unwrap().push("other task") }
            });
            // Bytes before any request do not wait for it.
            stream.write_all(b"early ").await.unwrap();
            log.lock().unwrap().push("early bytes");
            // An answer does.
            drop(InFlight::start(Arc::clone(&activity)));
            stream.write_all(b"one").await.unwrap();
            log.lock().unwrap().push("answer");
            other.await.unwrap();
            assert_eq!(
                *log.lock().unwrap(),
                ["early bytes", "other task", "answer"]
            );
            assert_eq!(stream.inner, b"early one");
        });
    }
}
