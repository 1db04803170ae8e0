//! Which calls end a deleted pod's GPU billing, and when its grace period is over: the rules
//! `cloud::billing` sends by and `pods::finish::delete` waits by.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::controller::memory::PodMemory;
use crate::provider::{Ends, Instance, InstanceState};

/// The call that ends an instance's GPU billing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndCall {
    /// The container gets its signal; the DELETE follows after the grace period.
    Stop,
    /// One DELETE: a grace-0 deletion, or an instance that is not running yet.
    Terminate,
}

/// The deletion grace period the pod asked for (30 s when unset, as the apiserver's default).
pub(crate) fn grace_period(meta: &ObjectMeta) -> Duration {
    Duration::from_secs(
        meta.deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0)
            .unsigned_abs(),
    )
}

/// Whether this instance still bills a GPU as far as this leader knows: live, not in a stopped
/// state, and no stop of it accepted.
pub(crate) fn bills_gpu(instance: &Instance, memory: &PodMemory) -> bool {
    instance.state.termination_ends() == Ends::GpuBilling
        && !memory.stopped.contains(&instance.id)
        && !memory.terminated.contains(&instance.id)
}

/// The calls a deleted pod's instances need now to end GPU billing: none for a pod not being
/// deleted, nor for an instance that bills no GPU, nor for one whose call was sent or is under
/// way (`memory`).
pub(crate) fn due<'a>(
    meta: &ObjectMeta,
    live: impl IntoIterator<Item = &'a Instance>,
    memory: &PodMemory,
) -> Vec<(&'a Instance, EndCall)> {
    if meta.deletion_timestamp.is_none() {
        return Vec::new();
    }
    let grace = grace_period(meta);
    live.into_iter()
        .filter(|instance| bills_gpu(instance, memory))
        .filter(|instance| !memory.ending.contains(&instance.id))
        .filter(|instance| !memory.stop_sent.contains_key(&instance.id))
        .map(|instance| {
            let call = if !grace.is_zero() && instance.state == InstanceState::Running {
                EndCall::Stop
            } else {
                EndCall::Terminate
            };
            (instance, call)
        })
        .collect()
}

/// What a deleted pod still needs for an instance the list does not show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unlisted {
    /// Nothing: the pod may go once its listed instances are done.
    Nothing,
    /// An instance known by id (made or adopted by this leader, or recorded on the pod) that
    /// the list does not show: one DELETE by id ends it (an instance already gone counts as
    /// done).
    TerminateById(String),
    /// A create was sent and its answer is unknown (lost, or sent by a leader that died), so
    /// an instance may exist that the lists do not show yet. The pod waits for lists that
    /// settle it: whatever they show is stopped at once by this deletion, where a removed pod
    /// would leave it billing until garbage collection finds it.
    WaitForList,
}

/// What `unlisted` decides from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnlistedFacts<'a> {
    /// The instance this leader knows for the pod, else the one the pod records (none for a
    /// pod that ended: its instance was terminated before its phase was written).
    pub known: Option<&'a str>,
    /// The pod's instances in the list, not yet terminated.
    pub listed: &'a [&'a Instance],
    pub terminated: &'a HashSet<String>,
    /// A create may have made an instance the lists cannot show yet
    /// (`gates::unsettled`).
    pub create_unsettled: bool,
}

/// The deletion's call for what the list does not show.
pub(crate) fn unlisted(facts: &UnlistedFacts<'_>) -> Unlisted {
    if let Some(id) = facts.known
        && !facts.terminated.contains(id)
        && !facts.listed.iter().any(|instance| instance.id == id)
    {
        return Unlisted::TerminateById(id.to_owned());
    }
    if facts.listed.is_empty() && facts.create_unsettled {
        return Unlisted::WaitForList;
    }
    Unlisted::Nothing
}

/// Whether the instance `id` may be terminated for the deleted pod `uid`: one this leader made
/// or adopted (`remembered`), or, for an id read from the pod's annotation (a user can edit it),
/// one the cloud says (`looked_up`) is alive and tagged with this pod.
pub(crate) fn ours_to_end(
    id: &str,
    remembered: Option<&str>,
    uid: &str,
    looked_up: Option<&Instance>,
) -> bool {
    remembered == Some(id)
        || looked_up.is_some_and(|instance| {
            instance.id == id
                && instance.tags.pod_uid.as_deref() == Some(uid)
                && instance.state.is_live()
        })
}

#[cfg(test)]
mod tests;
