//! One single-threaded runtime per core for the connections, the way nginx runs a worker
//! process per core: each connection lives on one thread, with its own event loop, so its
//! readiness, its requests and its answers never cross threads. On the shared work-stealing
//! runtime, a worker that ran out of ready connections parked on a futex and was woken by the
//! one polling the event loop: about 3 µs of the webhook's CPU per review at 64 connections.
//!
//! A thread with few connections spins: for [`SPIN`] after each request starts it keeps
//! polling its event loop instead of sleeping in it, as the work-stealing schedulers of tokio
//! and Go spin before parking. Between one client's requests the thread would otherwise sleep,
//! and on a virtual machine waking a sleeping thread (and its idle core) costs more than the
//! review. A thread with many connections finds a request ready nearly always, so it does not
//! spin: that would only take the core from the clients.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Handle};
use tokio::sync::{Notify, oneshot};

/// How long a serving thread with few connections keeps polling after a request started.
const SPIN: Duration = Duration::from_micros(200);
/// A thread spins only while it serves at most this many connections.
const SPIN_MAX_CONNECTIONS: usize = 4;

thread_local! {
    /// The serving thread's own state; unset on other threads.
    static THIS_THREAD: std::cell::OnceCell<Arc<Spinner>> = const { std::cell::OnceCell::new() };
}

/// What a serving thread knows of its load.
struct Spinner {
    /// Wakes the spinning task when a request starts.
    notify: Notify,
    started: Instant,
    /// When the last request started, in nanoseconds since `started` (at least 1); 0: none yet.
    last_request: AtomicU64,
    connections: AtomicUsize,
}

impl Spinner {
    fn new() -> Self {
        Self {
            notify: Notify::new(),
            started: Instant::now(),
            last_request: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn few_connections(&self) -> bool {
        self.connections.load(Ordering::Relaxed) <= SPIN_MAX_CONNECTIONS
    }

    fn request_started(&self) {
        self.last_request
            .store(self.now().max(1), Ordering::Relaxed);
    }

    fn spinning(&self) -> bool {
        let last = self.last_request.load(Ordering::Relaxed);
        let since = Duration::from_nanos(self.now().saturating_sub(last));
        last != 0 && self.few_connections() && since < SPIN
    }

    /// Polls the event loop (each `yield_now` is one turn of it) while requests keep coming.
    async fn spin(self: Arc<Self>) {
        loop {
            self.notify.notified().await;
            while self.spinning() {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Called as each request starts, on the thread that serves it.
pub(super) fn request_started() {
    THIS_THREAD.with(|this| {
        if let Some(spinner) = this.get() {
            spinner.request_started();
            if spinner.few_connections() {
                spinner.notify.notify_one();
            }
        }
    });
}

/// The serving threads; dropping this stops them, ending the tasks still on them.
pub(super) struct ServingThreads {
    threads: Vec<Thread>,
    next: usize,
    /// Each thread runs until its sender is dropped.
    _stops: Vec<oneshot::Sender<()>>,
}

impl ServingThreads {
    /// A thread per available core (as cgroup CPU limits allow). A thread that cannot be
    /// started is left out (and said); with none, connections stay on the caller's runtime.
    pub(super) fn start() -> Self {
        let count = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let mut threads = Self {
            threads: Vec::with_capacity(count),
            next: 0,
            _stops: Vec::with_capacity(count),
        };
        for index in 0..count {
            match start_thread(index) {
                Ok((thread, stop)) => {
                    threads.threads.push(thread);
                    threads._stops.push(stop);
                }
                Err(error) => {
                    tracing::warn!(%error, index, "could not start a serving thread");
                }
            }
        }
        threads
    }

    /// The runtime the next connection goes to: the one serving the fewest connections, each
    /// in turn among equals.
    pub(super) fn next(&mut self) -> Option<Handle> {
        let count = self.threads.len();
        let fewest = (0..count)
            .map(|offset| (self.next + offset) % count)
            .min_by_key(|&index| self.threads[index].connections())?;
        self.next = fewest + 1;
        Some(self.threads[fewest].runtime.clone())
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.threads.len()
    }
}

/// A serving thread, as the listener sees it.
struct Thread {
    runtime: Handle,
    spinner: Arc<Spinner>,
}

impl Thread {
    fn connections(&self) -> usize {
        self.spinner.connections.load(Ordering::Relaxed)
    }
}

fn start_thread(index: usize) -> std::io::Result<(Thread, oneshot::Sender<()>)> {
    let runtime = Builder::new_current_thread().enable_all().build()?;
    let runtime_handle = runtime.handle().clone();
    let spinner = Arc::new(Spinner::new());
    let (stop, stopped) = oneshot::channel::<()>();
    let this = Arc::clone(&spinner);
    std::thread::Builder::new()
        .name(format!("webhook-serve-{index}"))
        .spawn(move || {
            THIS_THREAD.with(|cell| {
                cell.get_or_init(|| Arc::clone(&this));
            });
            runtime.spawn(this.spin());
            // Resolves when the sender is sent to or dropped; the runtime, dropped here on a
            // plain thread, then cancels what is left on it.
            let _ = runtime.block_on(stopped);
        })?;
    Ok((
        Thread {
            runtime: runtime_handle,
            spinner,
        },
        stop,
    ))
}

/// Runs `serve` for a connection accepted on another runtime, registering its socket with this
/// thread's event loop (a socket stays with the event loop it was registered with).
pub(super) async fn on_this_thread<F, Fut>(tcp: std::net::TcpStream, serve: F)
where
    F: FnOnce(tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()>,
{
    let tcp = match tokio::net::TcpStream::from_std(tcp) {
        Ok(tcp) => tcp,
        Err(error) => {
            tracing::warn!(%error, "could not register a connection");
            return;
        }
    };
    let spinner = THIS_THREAD.with(|this| this.get().cloned());
    let _counted = spinner.map(Counted::new);
    serve(tcp).await;
}

/// One open connection on its thread, for as long as it lives.
struct Counted(Arc<Spinner>);

impl Counted {
    fn new(spinner: Arc<Spinner>) -> Self {
        spinner.connections.fetch_add(1, Ordering::Relaxed);
        Self(spinner)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_go_to_the_least_loaded_thread_and_run_there() {
        let mut threads = ServingThreads::start();
        assert!(threads.len() >= 1);
        let mut names = Vec::new();
        for _ in 0..threads.len() * 2 {
            let handle = threads.next().expect("a serving thread");
            let name = handle
                .spawn(async { std::thread::current().name().map(str::to_owned) })
                .await
                .expect("the task ran");
            names.push(name.expect("a named thread"));
        }
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), threads.len(), "{names:?}");
        assert!(names.iter().all(|name| name.starts_with("webhook-serve-")));
        assert_eq!(
            names[0],
            names[threads.len()],
            "in turn among equals: {names:?}"
        );

        // A thread serving a connection is passed over while another serves none.
        if threads.len() >= 2 {
            let busy = Counted::new(Arc::clone(&threads.threads[0].spinner));
            for _ in 0..3 {
                let handle = threads.next().expect("a serving thread");
                let name = handle
                    .spawn(async { std::thread::current().name().map(str::to_owned) })
                    .await
                    .expect("the task ran");
                assert_ne!(name.as_deref(), Some("webhook-serve-0"));
                if threads.len() == 2 {
                    assert_eq!(name.as_deref(), Some("webhook-serve-1"));
                }
            }
            drop(busy);
        }
    }

    #[test]
    fn a_thread_spins_after_a_request_only_while_it_has_few_connections() {
        let spinner = Spinner::new();
        assert!(!spinner.spinning(), "no request yet, nothing to spin for");
        spinner.request_started();
        assert!(spinner.spinning());
        spinner
            .connections
            .store(SPIN_MAX_CONNECTIONS + 1, Ordering::Relaxed);
        assert!(!spinner.spinning(), "many connections: no spin");
        spinner.connections.store(1, Ordering::Relaxed);
        std::thread::sleep(SPIN * 2);
        assert!(
            !spinner.spinning(),
            "the spin ends {SPIN:?} after the last request"
        );
    }
}
