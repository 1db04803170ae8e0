//! Background tasks that must live as long as the server (certificate reload, cache watches).
//! One that ends or panics is reported, so the process shuts down and exits non-zero instead of
//! running on without it, unnoticed.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinHandle, JoinSet};

/// A background task stopped while the server still needed it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TaskError {
    #[error("background task {name:?} ended")]
    Ended { name: &'static str },
    #[error("background task {name:?} panicked: {message}")]
    Panicked { name: &'static str, message: String },
}

/// The tasks; all of them are aborted when the supervisor is dropped.
#[derive(Default)]
pub(crate) struct Supervisor {
    /// Each task's output is the panic message of an adopted task, if it panicked.
    tasks: JoinSet<Option<String>>,
    names: HashMap<Id, &'static str>,
}

impl Supervisor {
    /// Runs `task` in the background under `name`.
    pub(crate) fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(async move {
            task.await;
            None
        });
        self.names.insert(handle.id(), name);
    }

    /// Watches a task spawned elsewhere; it is aborted with the supervisor.
    pub(crate) fn adopt(&mut self, name: &'static str, handle: JoinHandle<()>) {
        let handle = self.tasks.spawn(async move {
            let mut task = AbortOnDrop(handle);
            match (&mut task.0).await {
                Err(error) if error.is_panic() => Some(panic_message(error.into_panic())),
                _ => None,
            }
        });
        self.names.insert(handle.id(), name);
    }

    /// Resolves when the first task ends; never while all of them run.
    pub(crate) async fn failed(&mut self) -> TaskError {
        let Some(ended) = self.tasks.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, panic) = match ended {
            Ok((id, adopted_panic)) => (id, adopted_panic),
            Err(error) => {
                let id = error.id();
                let panic = error.try_into_panic().ok().map(panic_message);
                (id, panic)
            }
        };
        let name = self.names.remove(&id).unwrap_or("unnamed");
        match panic {
            Some(message) => TaskError::Panicked { name, message },
            None => TaskError::Ended { name },
        }
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_task_that_panics_is_reported_with_its_name_and_message() {
        let mut supervisor = Supervisor::default();
        supervisor.spawn("forever", std::future::pending());
        supervisor.spawn("reload", async { panic!("`period` must be non-zero.") });
        let failed = tokio::time::timeout(BOUND, supervisor.failed()).await;
        let Ok(TaskError::Panicked { name, message }) = failed else {
            panic!("not reported as a panic: {failed:?}");
        };
        assert_eq!(name, "reload");
        assert!(message.contains("non-zero"), "{message}");
    }

    #[tokio::test]
    async fn a_task_that_returns_is_reported_as_ended() {
        let mut supervisor = Supervisor::default();
        supervisor.spawn("forever", std::future::pending());
        supervisor.spawn("watch", async {});
        let failed = tokio::time::timeout(BOUND, supervisor.failed()).await;
        assert!(
            matches!(failed, Ok(TaskError::Ended { name: "watch" })),
            "{failed:?}"
        );
    }

    #[tokio::test]
    async fn an_adopted_task_that_panics_is_reported() {
        let mut supervisor = Supervisor::default();
        let handle = tokio::spawn(async { panic!("watch stream broke") });
        supervisor.adopt("namespace cache", handle);
        let failed = tokio::time::timeout(BOUND, supervisor.failed()).await;
        assert!(
            matches!(
                &failed,
                Ok(TaskError::Panicked { name: "namespace cache", message }) if message.contains("broke")
            ),
            "{failed:?}"
        );
    }

    #[tokio::test]
    async fn running_tasks_are_no_failure_and_are_aborted_on_drop() {
        let (alive, mut gone) = tokio::sync::mpsc::channel::<()>(1);
        let mut supervisor = Supervisor::default();
        let handle = tokio::spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        });
        supervisor.adopt("cache", handle);
        tokio::select! {
            biased;
            failed = supervisor.failed() => panic!("reported while running: {failed}"),
            () = tokio::task::yield_now() => {}
        }
        drop(supervisor);
        // The adopted task's sender is dropped once it is aborted.
        let aborted = tokio::time::timeout(BOUND, gone.recv()).await;
        assert!(matches!(aborted, Ok(None)), "{aborted:?}");
    }
}
