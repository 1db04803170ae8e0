//! `simulator --cloud vastai` serves the Vast.ai API on the port it prints, with the key from
//! `VAST_API_KEY` only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

const KEY: &str = "vast_CLI_TEST_KEY_42";

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_simulator_subcommand_serves_vastai() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut child = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["simulator", "--cloud", "vastai", "--listen", "127.0.0.1:0"])
        .env("VAST_API_KEY", KEY)
        .env_remove("RUNPOD_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let served = Served(child);
    let url = line
        .trim()
        .strip_prefix("vastai simulator listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let client = reqwest::Client::new();
    let search = |key: &'static str| {
        client
            .post(format!("{url}/api/v0/bundles/"))
            .bearer_auth(key)
            .json(&json!({"gpu_name": {"eq": "RTX 4090"}, "limit": 3}))
            .send()
    };
    let found: Value = search(KEY).await.unwrap().json().await.unwrap();
    let offers = found["offers"].as_array().unwrap();
    assert_eq!(offers.len(), 3);
    assert!(offers.iter().all(|offer| offer["gpu_name"] == "RTX 4090"));
    assert_eq!(search("another-key").await.unwrap().status(), 401);
    drop(served);
}
