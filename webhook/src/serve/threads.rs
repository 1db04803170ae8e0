//! One single-threaded runtime per core for the connections, the way nginx runs a worker
//! process per core: each connection lives on one thread, with its own event loop, so its
//! readiness, its requests and its answers never cross threads. On the shared work-stealing
//! runtime, a worker that ran out of ready connections parked on a futex and was woken by the
//! one polling the event loop: about 2 µs of the webhook's CPU per review at 64 connections.
//!
//! A thread with few connections spins: for [`SPIN`] after each request starts it keeps
//! polling its event loop instead of sleeping in it, as the work-stealing schedulers of tokio
//! and Go spin before parking. Between one client's requests the thread would otherwise sleep,
//! and on a virtual machine waking a sleeping thread (and its idle core) adds tens of
//! microseconds to each round trip. A thread with many connections finds a request ready
//! nearly always, so it does not spin: that would only take the core from the clients.

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
    /// How many times the spinning task was woken (tests).
    #[cfg(test)]
    woken: AtomicU64,
}

impl Spinner {
    fn new() -> Self {
        Self {
            notify: Notify::new(),
            started: Instant::now(),
            last_request: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            #[cfg(test)]
            woken: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn few_connections(&self) -> bool {
        few(self.connections.load(Ordering::Relaxed))
    }

    fn request_started(&self) {
        self.last_request
            .store(self.now().max(1), Ordering::Relaxed);
    }

    fn spinning(&self) -> bool {
        spinning_at(
            self.last_request.load(Ordering::Relaxed),
            self.now(),
            self.connections.load(Ordering::Relaxed),
        )
    }

    /// Polls the event loop (each `yield_now` is one turn of it) while requests keep coming.
    async fn spin(self: Arc<Self>) {
        loop {
            self.notify.notified().await;
            #[cfg(test)]
            self.woken.fetch_add(1, Ordering::Relaxed);
            while self.spinning() {
                tokio::task::yield_now().await;
            }
        }
    }
}

fn few(connections: usize) -> bool {
    connections <= SPIN_MAX_CONNECTIONS
}

/// Whether a thread keeps polling at `now`, its last request having started at `last` (both in
/// nanoseconds on its clock; 0: none yet), while it serves `connections`.
fn spinning_at(last: u64, now: u64, connections: usize) -> bool {
    last != 0 && few(connections) && Duration::from_nanos(now.saturating_sub(last)) < SPIN
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

/// The serving threads; dropping this stops them, ending the tasks still on them
/// ([`Self::stop`] also waits until they have ended).
pub(super) struct ServingThreads {
    threads: Vec<Thread>,
    next: usize,
}

impl ServingThreads {
    /// A thread per available core (as cgroup CPU limits allow). A thread that cannot be
    /// started is left out (and said); with none, connections stay on the caller's runtime.
    pub(super) fn start() -> Self {
        let count = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let mut threads = Self {
            threads: Vec::with_capacity(count),
            next: 0,
        };
        for index in 0..count {
            match start_thread(index) {
                Ok(thread) => threads.threads.push(thread),
                Err(error) => {
                    tracing::warn!(%error, index, "could not start a serving thread");
                }
            }
        }
        threads
    }

    /// Where the next connection goes: the thread serving the fewest connections, each in turn
    /// among equals. It counts as served there from now on, so a burst of accepts is spread.
    pub(super) fn next(&mut self) -> Option<Placement> {
        let count = self.threads.len();
        let fewest = (0..count)
            .map(|offset| (self.next + offset) % count)
            .min_by_key(|&index| {
                self.threads
                    .get(index)
                    .map_or(usize::MAX, Thread::connections)
            })?;
        let thread = self.threads.get(fewest)?;
        self.next = fewest + 1;
        Some(Placement {
            runtime: thread.runtime.clone(),
            counted: Counted::new(Arc::clone(&thread.spinner)),
        })
    }

    /// Stops the threads and waits until each has ended (its runtime dropped with what was
    /// left on it).
    pub(super) async fn stop(mut self) {
        let joins: Vec<_> = self
            .threads
            .drain(..)
            .filter_map(|thread| {
                drop(thread.stop);
                thread.join
            })
            .collect();
        let joined = tokio::task::spawn_blocking(move || {
            for join in joins {
                if join.join().is_err() {
                    tracing::error!("a serving thread panicked");
                }
            }
        });
        if let Err(error) = joined.await {
            tracing::error!(%error, "could not wait for the serving threads");
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.threads.len()
    }
}

/// A connection's thread, and its place in that thread's count while it lives.
pub(super) struct Placement {
    pub runtime: Handle,
    pub counted: Counted,
}

/// A serving thread, as the listener sees it.
struct Thread {
    runtime: Handle,
    spinner: Arc<Spinner>,
    /// The thread runs until this is sent to or dropped.
    stop: oneshot::Sender<()>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl Thread {
    fn connections(&self) -> usize {
        self.spinner.connections.load(Ordering::Relaxed)
    }
}

/// Starts a serving thread. Its runtime is built on the thread itself, so that nothing is left
/// to drop here (inside the caller's runtime, where dropping a runtime panics) when either
/// step fails.
fn start_thread(index: usize) -> std::io::Result<Thread> {
    let spinner = Arc::new(Spinner::new());
    let this = Arc::clone(&spinner);
    let (stop, stopped) = oneshot::channel::<()>();
    let (started, handle) = std::sync::mpsc::channel::<std::io::Result<Handle>>();
    let join = std::thread::Builder::new()
        .name(format!("webhook-serve-{index}"))
        .spawn(move || {
            let runtime = match Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = started.send(Err(error));
                    return;
                }
            };
            THIS_THREAD.with(|cell| {
                cell.get_or_init(|| Arc::clone(&this));
            });
            runtime.spawn(this.spin());
            if started.send(Ok(runtime.handle().clone())).is_err() {
                return;
            }
            // Resolves when the sender is sent to or dropped; the runtime, dropped here on a
            // plain thread, then cancels what is left on it.
            let _ = runtime.block_on(stopped);
        })?;
    // Start-up: a short blocking wait for the thread's runtime.
    let runtime = handle
        .recv()
        .map_err(|_| std::io::Error::other("the serving thread ended before its runtime ran"))??;
    Ok(Thread {
        runtime,
        spinner,
        stop,
        join: Some(join),
    })
}

/// Runs `serve` for a connection accepted on another runtime, registering its socket with this
/// thread's event loop (a socket stays with the event loop it was registered with).
pub(super) async fn on_this_thread<F, Fut>(tcp: std::net::TcpStream, serve: F)
where
    F: FnOnce(tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()>,
{
    match tokio::net::TcpStream::from_std(tcp) {
        Ok(tcp) => serve(tcp).await,
        Err(error) => tracing::warn!(%error, "could not register a connection"),
    }
}

/// One open connection on its thread, for as long as it lives.
pub(super) struct Counted(Arc<Spinner>);

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

    async fn thread_name(runtime: &Handle) -> String {
        runtime
            .spawn(async { std::thread::current().name().map(str::to_owned) })
            .await
            .expect("the task ran")
            .expect("a named thread")
    }

    #[tokio::test]
    async fn connections_go_to_the_least_loaded_thread_and_run_there() {
        let mut threads = ServingThreads::start();
        assert!(threads.len() >= 1);
        let mut names = Vec::new();
        for _ in 0..threads.len() * 2 {
            let placed = threads.next().expect("a serving thread");
            names.push(thread_name(&placed.runtime).await);
        }
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), threads.len(), "{names:?}");
        assert!(names.iter().all(|name| name.starts_with("webhook-serve-")));
        assert_eq!(
            names[0],
            names[threads.len()],
            "in turn among equals: {names:?}"
        );

        // A placed connection counts at once: the next goes elsewhere while it lives.
        if threads.len() >= 2 {
            let first = threads.next().expect("a serving thread");
            let first_name = thread_name(&first.runtime).await;
            for _ in 0..3 {
                let other = threads.next().expect("a serving thread");
                assert_ne!(thread_name(&other.runtime).await, first_name);
            }
            drop(first);
        }
        threads.stop().await;
    }

    #[test]
    fn a_thread_spins_after_a_request_only_while_it_has_few_connections() {
        let micros = |n: u64| n * 1_000;
        assert!(!spinning_at(0, micros(10), 1), "no request yet");
        assert!(spinning_at(micros(100), micros(100), 1));
        assert!(spinning_at(micros(100), micros(299), SPIN_MAX_CONNECTIONS));
        assert!(
            !spinning_at(micros(100), micros(300), 1),
            "ends {SPIN:?} after"
        );
        assert!(!spinning_at(
            micros(100),
            micros(101),
            SPIN_MAX_CONNECTIONS + 1
        ));
        assert!(
            spinning_at(micros(100), micros(50), 1),
            "a clock read before it"
        );
    }

    #[tokio::test]
    async fn a_request_on_a_serving_thread_wakes_its_spinner_unless_the_thread_is_busy() {
        let mut threads = ServingThreads::start();
        let placed = threads.next().expect("a serving thread");
        let spinner = Arc::clone(&threads.threads[0].spinner);
        assert_eq!(spinner.woken.load(Ordering::Relaxed), 0);
        let request = || async { request_started() };
        placed.runtime.spawn(request()).await.expect("ran");
        let woken = async {
            while spinner.woken.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), woken)
            .await
            .expect("the spinner woke");
        assert_ne!(spinner.last_request.load(Ordering::Relaxed), 0);

        // Off a serving thread, nothing is recorded anywhere.
        request_started();

        let busy: Vec<Counted> = (0..SPIN_MAX_CONNECTIONS)
            .map(|_| Counted::new(Arc::clone(&spinner)))
            .collect();
        placed.runtime.spawn(request()).await.expect("ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(spinner.woken.load(Ordering::Relaxed), 1, "busy: not woken");
        drop(busy);
        drop(placed);
        threads.stop().await;
    }
}
