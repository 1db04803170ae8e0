//! Connections are served on the listener's serving threads (one single-threaded runtime per
//! core, `serve/threads.rs`), spread over all of them, h2 streams included; and the threads end
//! with the server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use runpod_webhook::cluster::{ClusterView, LookupError, MemoryCluster};
use runpod_webhook::policy::OwningJob;
use runpod_webhook::serve::ServeOptions;
use support::{gpu_pod, opted_in_cluster, policy, request, review, start_with};

/// The opted-in cluster, noting the thread each review is judged on.
struct Recording {
    inner: MemoryCluster,
    threads: Mutex<Vec<String>>,
}

impl Recording {
    fn judged_on(&self) -> Vec<String> {
        self.threads.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

impl ClusterView for Recording {
    async fn namespace_labels(&self, name: &str) -> Result<BTreeMap<String, String>, LookupError> {
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed").to_owned();
        if let Ok(mut threads) = self.threads.lock() {
            threads.push(thread);
        }
        self.inner.namespace_labels(name).await
    }

    async fn job(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<OwningJob>, LookupError> {
        self.inner.job(namespace, name, uid).await
    }

    fn synced(&self) -> bool {
        true
    }
}

/// The names of this process's threads that serve connections.
fn serving_threads_alive() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("webhook-serve"))
        .collect()
}

#[tokio::test]
async fn reviews_are_judged_on_every_serving_thread_which_end_with_the_server() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cluster = Recording {
        inner: opted_in_cluster(),
        threads: Mutex::new(Vec::new()),
    };
    let options = ServeOptions {
        shutdown_drain: Duration::from_millis(100),
        ..ServeOptions::default()
    };
    let mut server = start_with(cluster, policy(), Duration::from_secs(3600), options).await;
    let body = serde_json::to_vec(&review(gpu_pod())).unwrap();

    // A connection per review (HTTP/1.1), then one over h2: each goes to the next thread.
    for _ in 0..cores * 2 {
        let reply = request(
            server.addr,
            &server.ca_pem,
            "POST",
            "/mutate",
            body.clone(),
            false,
        )
        .await;
        assert_eq!(reply.status, http::StatusCode::OK);
    }
    let reply = request(server.addr, &server.ca_pem, "POST", "/mutate", body, true).await;
    assert_eq!(reply.alpn.as_deref(), Some(b"h2".as_slice()));
    assert_eq!(reply.status, http::StatusCode::OK);

    let judged_on = server.cluster.judged_on();
    assert_eq!(judged_on.len(), cores * 2 + 1, "{judged_on:?}");
    assert!(
        judged_on
            .iter()
            .all(|name| name.starts_with("webhook-serve-")),
        "every review on a serving thread: {judged_on:?}"
    );
    let distinct: BTreeSet<&String> = judged_on.iter().collect();
    assert_eq!(
        distinct.len(),
        cores,
        "spread over all {cores}: {judged_on:?}"
    );
    assert_eq!(serving_threads_alive().len(), cores);

    server.begin_shutdown();
    assert!(server.finished_within(Duration::from_secs(30)).await);
    let ended = async {
        while !serving_threads_alive().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .unwrap_or_else(|_| panic!("still running: {:?}", serving_threads_alive()));
}
