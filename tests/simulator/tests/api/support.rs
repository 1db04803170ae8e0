//! Helpers: a started simulator with a plain-HTTP reqwest client, JSON calls, polling, an SSE
//! reader, and the contract check every test ends with.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::header::HeaderMap;
use runpod_simulator::contract::SpecValidator;
use runpod_simulator::scenario::{RateLimitSpec, Scenario};
use runpod_simulator::{Simulator, SimulatorHandle};
use serde_json::{Value, json};

pub const KEY: &str = "rpa_test_key";
pub const RTX_4090: &str = "NVIDIA GeForce RTX 4090";

/// Short lifecycle delays so tests see every state quickly, and a quota that polling every
/// few milliseconds does not exhaust.
pub fn fast() -> Scenario {
    Scenario {
        provisioning_ms: 150,
        starting_ms: 150,
        ports_ms: 150,
        rate_limits: vec![RateLimitSpec {
            name: "minute".into(),
            quota: 100_000,
            window_secs: 60,
            ..RateLimitSpec::default()
        }],
        ..Scenario::default()
    }
}

pub fn spec() -> &'static SpecValidator {
    static SPEC: OnceLock<SpecValidator> = OnceLock::new();
    SPEC.get_or_init(SpecValidator::load)
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// A response, body parsed as JSON (`Null` when empty).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or_default()
    }
}

pub struct Api {
    pub sim: SimulatorHandle,
    pub http: reqwest::Client,
    pub key: Option<String>,
}

impl Api {
    pub async fn start(scenario: Scenario) -> Api {
        let sim = Simulator::start(scenario, Some(KEY.to_owned()))
            .await
            .expect("simulator starts");
        Api {
            sim,
            http: client(),
            key: Some(KEY.to_owned()),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.sim.base_url())
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, self.url(path));
        match &self.key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    pub async fn send(&self, builder: reqwest::RequestBuilder) -> Resp {
        let response = builder.send().await.expect("request sent");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("body read");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)))
        };
        Resp {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send(self.request(reqwest::Method::DELETE, path)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        self.send(self.request(reqwest::Method::POST, path).json(body))
            .await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> Resp {
        self.send(self.request(reqwest::Method::PATCH, path).json(body))
            .await
    }

    /// Creates a 1×RTX 4090 pod (201 expected) and returns its JSON.
    pub async fn create(&self, name: &str, extra: Value) -> Value {
        let mut body = json!({"name": name, "image": "runpod/pytorch:2.4.0", "gpu": {"id": RTX_4090, "count": 1}});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                body.insert(k.clone(), v.clone());
            }
        }
        let resp = self.post("/v2/pods", &body).await;
        assert_eq!(resp.status, 201, "create {name}: {:?}", resp.body);
        resp.body
    }

    /// Polls `GET /v2/pods/{id}` until `done` holds, returning every status seen on the way.
    pub async fn wait_for(
        &self,
        id: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> (Value, Vec<String>) {
        let deadline = Instant::now() + timeout;
        let mut seen: Vec<String> = Vec::new();
        loop {
            let resp = self.get(&format!("/v2/pods/{id}")).await;
            assert_eq!(resp.status, 200, "{:?}", resp.body);
            let status = resp.body["status"].as_str().unwrap_or_default().to_owned();
            if seen.last() != Some(&status) {
                seen.push(status);
            }
            if done(&resp.body) {
                return (resp.body, seen);
            }
            assert!(
                Instant::now() < deadline,
                "timed out; statuses seen {seen:?}, last {}",
                resp.body
            );
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }

    /// Every recorded exchange conforms to the OpenAPI spec.
    pub fn assert_contract(&self) {
        let exchanges = self.sim.exchanges();
        assert!(!exchanges.is_empty(), "no exchange recorded");
        let violations = spec().check_all(&exchanges);
        assert!(
            violations.is_empty(),
            "contract violations:\n{}",
            violations.join("\n")
        );
    }
}

/// One SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: String,
    pub data: Value,
}

impl Event {
    pub fn line(&self) -> &str {
        self.data["line"].as_str().unwrap_or_default()
    }
}

/// Reads events from a `text/event-stream` response.
pub struct Sse {
    stream: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    buffer: String,
    pub ended: bool,
}

impl Sse {
    pub fn new(response: reqwest::Response) -> Sse {
        Sse {
            stream: response.bytes_stream().boxed(),
            buffer: String::new(),
            ended: false,
        }
    }

    /// The next event, or `None` if the stream ended or nothing came within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut id = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = Some(serde_json::from_str(v).expect("data is JSON"));
                    }
                }
                if let (Some(id), Some(data)) = (id, data) {
                    return Some(Event { id, data });
                }
                continue; // a comment (keep-alive)
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Err(_) => return None,
                Ok(None) => {
                    self.ended = true;
                    return None;
                }
                Ok(Some(chunk)) => {
                    let chunk = chunk.expect("stream chunk");
                    self.buffer.push_str(&String::from_utf8_lossy(&chunk));
                }
            }
        }
    }

    /// Every event until `wait` passes without one.
    pub async fn drain(&mut self, wait: Duration) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next(wait).await {
            events.push(event);
        }
        events
    }
}
