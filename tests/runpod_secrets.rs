//! Secret hygiene: the API key never appears in a log line (at any level, from any crate),
//! an error message, or a `Debug` rendering — including when RunPod rejects the key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runpod_support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use runpod_kubelet::http::ApiKey;
use runpod_kubelet::runpod::client::RunPodClient;
use runpod_kubelet::runpod::config::{ClientConfig, RetryPolicy, retry_policy};
use runpod_kubelet::runpod::error::ApiError;
use runpod_kubelet::runpod::logs::LogRequest;
use runpod_simulator::Simulator;
use runpod_simulator::scenario::Scenario;
use runpod_support::{candidate, request_for};

const SERVER_KEY: &str = "rpa_SERVERSIDEKEY_0123456789";
const WRONG_KEY: &str = "rpa_WRONGKEY_abcdefghijklmnop";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_key_never_leaks() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let sim = Simulator::start(
        Scenario {
            provisioning_ms: 50,
            starting_ms: 50,
            ports_ms: 50,
            ..Scenario::default()
        },
        Some(SERVER_KEY.to_owned()),
    )
    .await
    .unwrap();
    let config = |_: ()| ClientConfig {
        api_url: sim.base_url(),
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(20),
            lookup_interval: Duration::from_millis(50),
            ..retry_policy()
        },
        ..ClientConfig::default()
    };
    let mut texts = Vec::new();

    // A rejected key: the error says so without echoing it.
    let wrong = RunPodClient::new(config(()), ApiKey::new(WRONG_KEY.to_owned()).unwrap()).unwrap();
    let error = wrong.list_pods().await.unwrap_err();
    assert!(matches!(error, ApiError::Unauthorized { .. }), "{error:?}");
    texts.push(error.to_string());
    texts.push(format!("{error:?}"));
    texts.push(format!("{wrong:?}"));

    // A working key through every kind of call, including failures.
    let client =
        RunPodClient::new(config(()), ApiKey::new(SERVER_KEY.to_owned()).unwrap()).unwrap();
    texts.push(format!("{client:?}"));
    texts.push(format!("{:?}", ApiKey::new(SERVER_KEY.to_owned()).unwrap()));
    client.catalogue().await.unwrap();
    let placed = client
        .create_idempotent(
            "ns-secret-uid",
            &[candidate("NVIDIA GeForce RTX 4090", &[])],
            request_for("ns-secret-uid"),
        )
        .await
        .unwrap();
    texts.push(format!("{placed:?}"));
    let _ = client
        .logs(
            &placed.pod.id,
            LogRequest {
                quiet: Some(Duration::from_millis(100)),
                ..LogRequest::default()
            },
        )
        .collect::<Vec<_>>()
        .await;
    for error in [
        client.get_pod("nosuchpod00000").await.map(|_| ()).err(),
        client
            .pod_action(
                "nosuchpod00000",
                runpod_kubelet::runpod::model::PodAction::Stop,
            )
            .await
            .map(|_| ())
            .err(),
    ]
    .into_iter()
    .flatten()
    {
        texts.push(error.to_string());
        texts.push(format!("{error:?}"));
    }
    client.delete_pod(&placed.pod.id).await.unwrap();

    // The environment-variable path reports a missing key without any value.
    texts.push(runpod_kubelet::runpod::config::ConfigError::MissingKey.to_string());

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("runpod request"), "the capture works: {logs}");
    for key in [SERVER_KEY, WRONG_KEY] {
        assert!(!logs.contains(key), "key in the logs");
        for text in &texts {
            assert!(!text.contains(key), "key in {text}");
        }
        // Not even a recognisable fragment.
        assert!(!logs.contains(&key[4..16]));
    }
    let violations = runpod_simulator::contract::SpecValidator::load().check_all(&sim.exchanges());
    assert!(violations.is_empty(), "{violations:#?}");
    sim.shutdown().await;
}
