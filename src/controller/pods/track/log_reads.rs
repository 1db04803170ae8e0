//! What the controller reads from a container's log: how far its init containers got while it
//! runs, and, once it ended, its exit code and the lines kept for `kubectl logs`.

use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::super::{ReconcileError, write};
use crate::controller::context::Shared;
use crate::controller::node::health::ApiHealth;
use crate::controller::pods::decide::Note;
use crate::controller::pods::status::inits::inits_done;
use crate::provider::{Instance, InstanceState, Provider};

/// Failed reads of a finished container's log (while the API otherwise answers) before the
/// pod is finished with its exit code unknown: a log endpoint that keeps refusing must not
/// keep a stopped pod billing storage, nor its Job from completing.
pub(super) const LOG_READ_ATTEMPTS: u32 = 5;

/// Reads how far the pod's init containers got while its instance runs and they are not all
/// done (a read of the log; a failed read keeps what was known).
pub(super) async fn read_init_progress<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    instance: &Instance,
) {
    let known = ctx.remember(uid, |m| m.init_progress.clone());
    if inits_done(pod, known.as_ref()) || instance.state != InstanceState::Running {
        return;
    }
    match ctx.provider.init_progress(&instance.id).await {
        Ok(progress) => ctx.remember(uid, |m| {
            m.init_progress
                .get_or_insert_with(Default::default)
                .merge(progress)
        }),
        Err(error) => {
            tracing::debug!(instance = %instance.id, %error, "reading the init containers' progress failed")
        }
    }
}

/// The exit code of a finished container, as far as it can be known.
pub(super) enum ExitCode {
    /// Read from the log (`None`: the log names no code).
    Read(Option<i32>),
    /// The log could not be read, [`LOG_READ_ATTEMPTS`] times.
    Unreadable(String),
}

pub(super) async fn exit_code<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    instance: &Instance,
) -> Result<ExitCode, ReconcileError> {
    if let Some(code) = ctx.remember(uid, |m| m.exit_code) {
        return Ok(ExitCode::Read(code));
    }
    match ctx.provider.final_log(&instance.id).await {
        Ok(log) => {
            let code = log.exit_code;
            let warnings = log
                .warnings
                .iter()
                .map(|(reason, message)| Note::warning(reason, message.clone()))
                .collect();
            write::notes(ctx, pod, warnings).await;
            ctx.remember(uid, |m| {
                m.exit_code = Some(code);
                m.final_log = Some(std::sync::Arc::new(log.lines));
                m.final_init_logs = Some(std::sync::Arc::new(log.init_lines));
                m.init_progress
                    .get_or_insert_with(Default::default)
                    .merge(log.init);
            });
            Ok(ExitCode::Read(code))
        }
        Err(error) => {
            // Failures while the whole API is down are not the log's: they are not counted.
            let api_up = matches!(*ctx.health.borrow(), ApiHealth::Available);
            let failures = ctx.remember(uid, |m| {
                if api_up {
                    m.log_read_failures += 1;
                }
                m.log_read_failures
            });
            warn!(instance = %instance.id, error = %error, failures, "reading the exit code from the log failed");
            if failures >= LOG_READ_ATTEMPTS {
                Ok(ExitCode::Unreadable(error.to_string()))
            } else {
                Err(ReconcileError::Provider(error))
            }
        }
    }
}
