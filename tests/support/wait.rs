//! Polling with a deadline: the cluster converges asynchronously, tests wait for a state.

use std::future::Future;
use std::time::Duration;

use anyhow::bail;

/// Polls `probe` every 250 ms until it yields `Some`, or fails after `timeout` naming `what`.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last_error = Some(error),
        }
        if tokio::time::Instant::now() >= deadline {
            match last_error {
                Some(error) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {error:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
