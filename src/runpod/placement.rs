//! Creating the one RunPod pod for a Kubernetes pod: look up by the deterministic name first,
//! then walk the placement candidates, classifying every failure as the v2 spec says. A create
//! that failed ambiguously (5xx, timeout) may have made a billed pod (api-notes P3), so the
//! name is looked up again — several times, because the list lags — before any new create.

use tracing::{info, instrument, warn};

use super::client::RunPodClient;
use super::error::{ApiError, Recovery};
use super::limiter::Priority;
use super::model::{CreatePodRequest, Pod, PodStatus};
use super::select::Candidate;

/// What a create whose outcome stayed unknown after the lookups leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterAmbiguous {
    /// Send it again (a stand-alone caller with nothing else to settle it).
    RetryAfterLookups,
    /// Stop: the caller waits for a settled list before any new create (the controller).
    GiveUpUnsettled,
}

/// One refused create, for events and the final error.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub gpu_id: String,
    pub data_center_ids: Vec<String>,
    pub error: ApiError,
}

/// The pod that now exists for this name.
#[derive(Debug, Clone)]
pub struct Placement {
    pub pod: Pod,
    /// The candidate that was created, or `None` when an existing pod was adopted.
    pub candidate: Option<Candidate>,
    /// Refusals before success (capacity, pool access…), oldest first.
    pub attempts: Vec<Attempt>,
    /// Further live pods with the same name (a duplicate made by someone else or an older
    /// version): the caller should terminate them.
    pub duplicates: Vec<Pod>,
    /// A create in this call failed ambiguously (5xx, timeout, unreadable answer) and its pod,
    /// if it made one, is neither `pod` nor in `duplicates`: the list may still hide it. The
    /// caller should look the name up again once the list has caught up (a minute is ample)
    /// and terminate every pod with this name but `pod`.
    pub possibly_duplicated: bool,
}

/// Why no pod exists.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PlacementError {
    #[error("no GPU type in the RunPod catalogue satisfies the pod's requirements")]
    NoCandidates,
    #[error(
        "no RunPod capacity: every candidate was refused ({})",
        summary(attempts)
    )]
    NoCapacity { attempts: Vec<Attempt> },
    #[error(
        "RunPod refused every candidate the same way, so the request itself is probably wrong: {detail}"
    )]
    RequestRejected {
        detail: String,
        attempts: Vec<Attempt>,
    },
    #[error("{0}")]
    Invalid(ApiError),
    #[error("{0}; no pod can be created until the RunPod balance is topped up")]
    PaymentRequired(ApiError),
    /// Transient failures used up the attempts, or a create failed in a way that may have
    /// made a pod the list does not show yet. The pod may or may not exist: call again later
    /// (the next call looks it up by name before creating); never fail the pod on this.
    #[error("RunPod kept failing, will retry: {0}")]
    Unsettled(ApiError),
}

fn summary(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(|attempt| format!("{}: {}", attempt.gpu_id, attempt.error.kind()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl RunPodClient {
    /// Makes sure exactly one pod named `name` exists, creating it on the first candidate
    /// that RunPod accepts. Safe to call again after any failure or crash.
    #[instrument(skip(self, candidates, build), fields(candidates = candidates.len()))]
    pub async fn create_idempotent(
        &self,
        name: &str,
        candidates: &[Candidate],
        build: impl Fn(&Candidate) -> CreatePodRequest,
    ) -> Result<Placement, PlacementError> {
        if let Some(placement) = self.adopt(name, Vec::new()).await.map_err(unsettled)? {
            return Ok(placement);
        }
        self.walk(name, candidates, build, AfterAmbiguous::RetryAfterLookups)
            .await
    }

    /// [`RunPodClient::create_idempotent`] without its first lookup, for a caller that has
    /// already established that no pod of this name exists (the controller: from complete
    /// lists taken after every earlier attempt settled). Saves one list call per create, which
    /// under a per-minute quota doubles the creates. Ambiguous failures are still settled by
    /// lookups, as in `create_idempotent`, but a create whose outcome stays unknown after them
    /// is never sent again here: the list may lag far longer than the lookups last, so the
    /// answer is `Unsettled` and the caller creates again only once a complete list taken
    /// `--create-settle` after this attempt shows no pod.
    #[instrument(skip(self, candidates, build), fields(candidates = candidates.len()))]
    pub async fn create_known_absent(
        &self,
        name: &str,
        candidates: &[Candidate],
        build: impl Fn(&Candidate) -> CreatePodRequest,
    ) -> Result<Placement, PlacementError> {
        self.walk(name, candidates, build, AfterAmbiguous::GiveUpUnsettled)
            .await
    }

    async fn walk(
        &self,
        name: &str,
        candidates: &[Candidate],
        build: impl Fn(&Candidate) -> CreatePodRequest,
        after_ambiguous: AfterAmbiguous,
    ) -> Result<Placement, PlacementError> {
        if candidates.is_empty() {
            return Err(PlacementError::NoCandidates);
        }
        let policy = self.retry_policy().clone();
        let mut attempts: Vec<Attempt> = Vec::new();
        // Set once a create failed in a way that may have made a pod (5xx, timeout, a body we
        // could not read). From then on a pod may exist that the lagging list does not show
        // yet: no other candidate is tried (it would be a second pod), and every way of giving
        // up says "unsettled" so the caller looks again instead of failing the pod.
        let mut maybe_created: Option<ApiError> = None;
        // How many creates failed that way: each may have made a pod the list still hides.
        let mut ambiguous_creates: u32 = 0;
        for candidate in candidates {
            let request = build(candidate);
            let mut failures = 0;
            let mut rate_limited = 0;
            loop {
                let error = match self.create_pod_once(&request).await {
                    Ok(pod) => {
                        self.recent().remember(name, &pod.id);
                        info!(pod_id = %pod.id, gpu = %candidate.gpu_id, "created RunPod pod");
                        let placement = Placement::made(pod, candidate, attempts);
                        return Ok(flag_unseen(placement, ambiguous_creates));
                    }
                    Err(error) => error,
                };
                warn!(gpu = %candidate.gpu_id, error = %error, "RunPod create failed");
                if error.create_outcome_unknown() {
                    ambiguous_creates += 1;
                    if let Some(placement) = self.settle(name, &attempts).await? {
                        return Ok(flag_unseen(placement, ambiguous_creates));
                    }
                    if after_ambiguous == AfterAmbiguous::GiveUpUnsettled {
                        return Err(PlacementError::Unsettled(error));
                    }
                    maybe_created = Some(error.clone());
                }
                let give_up = |outcome: PlacementError| match &maybe_created {
                    Some(unclear) => PlacementError::Unsettled(unclear.clone()),
                    None => outcome,
                };
                match error.recovery() {
                    Recovery::Fix | Recovery::Gone => {
                        return Err(give_up(PlacementError::Invalid(error)));
                    }
                    Recovery::Stop => return Err(give_up(PlacementError::PaymentRequired(error))),
                    Recovery::NextCandidate => {
                        if let Some(unclear) = &maybe_created {
                            // E.g. our own unseen pod took the last GPU of this type.
                            return Err(PlacementError::Unsettled(unclear.clone()));
                        }
                        attempts.push(attempt(candidate, error));
                        break;
                    }
                    Recovery::Reread => {
                        if let Some(placement) = self
                            .adopt(name, attempts.clone())
                            .await
                            .map_err(unsettled)?
                        {
                            return Ok(flag_unseen(placement, ambiguous_creates));
                        }
                        failures += 1;
                    }
                    Recovery::Retry => {
                        if let ApiError::RateLimited { .. } = error {
                            // The limiter holds the next request until Retry-After passed.
                            rate_limited += 1;
                            if rate_limited <= 10 {
                                continue;
                            }
                        }
                        failures += 1;
                    }
                }
                if failures >= policy.attempts {
                    return Err(PlacementError::Unsettled(error));
                }
                tokio::time::sleep(policy.backoff(failures - 1)).await;
            }
        }
        Err(exhausted(attempts))
    }

    /// After an ambiguous create: looks for the pod several times, because a pod created a
    /// moment ago can be missing from the list (api-notes P3).
    async fn settle(
        &self,
        name: &str,
        attempts: &[Attempt],
    ) -> Result<Option<Placement>, PlacementError> {
        let policy = self.retry_policy().clone();
        for lookup in 0..policy.lookup_attempts.max(1) {
            if lookup > 0 {
                tokio::time::sleep(policy.lookup_interval).await;
            }
            match self.adopt(name, attempts.to_vec()).await {
                Ok(Some(placement)) => return Ok(Some(placement)),
                Ok(None) => {}
                // Cannot tell whether the pod exists: creating again could double-bill.
                Err(error) => return Err(PlacementError::Unsettled(error)),
            }
        }
        Ok(None)
    }

    /// Adopts an existing pod with this name: the oldest one, the rest reported as duplicates.
    async fn adopt(
        &self,
        name: &str,
        attempts: Vec<Attempt>,
    ) -> Result<Option<Placement>, ApiError> {
        let mut existing = self.find_by_name(name, Priority::Create).await?;
        if existing.is_empty() {
            // Created by this client a moment ago, maybe not listed yet: ask for it by id.
            let Some(id) = self.recent().pod_id(name) else {
                return Ok(None);
            };
            match self.get_pod(&id).await? {
                Some(pod) if pod.status != PodStatus::Terminated => existing.push(pod),
                _ => {
                    self.recent().forget_pod(&id);
                    return Ok(None);
                }
            }
        }
        // Oldest first (by time, not text: "…:00.5Z" < "…:00Z" as strings); unknown last.
        existing.sort_by_key(|pod| {
            let created = pod
                .created_at
                .as_deref()
                .and_then(|ts| ts.parse::<k8s_openapi::jiff::Timestamp>().ok());
            (created.is_none(), created, pod.id.clone())
        });
        let pod = existing.remove(0);
        info!(pod_id = %pod.id, duplicates = existing.len(), "adopted existing RunPod pod");
        Ok(Some(Placement {
            pod,
            candidate: None,
            attempts,
            duplicates: existing,
            possibly_duplicated: false,
        }))
    }
}

/// Sets `possibly_duplicated` when more creates may have made a pod than the placement
/// accounts for: a pod we created or adopted, plus the duplicates the list showed. A created
/// pod accounts for none of the ambiguous creates before it; each pod the list showed may be
/// one of them.
fn flag_unseen(mut placement: Placement, ambiguous_creates: u32) -> Placement {
    let accounted = if placement.candidate.is_some() {
        0
    } else {
        1 + placement.duplicates.len()
    };
    let unseen = usize::try_from(ambiguous_creates)
        .unwrap_or(usize::MAX)
        .saturating_sub(accounted);
    if unseen > 0 {
        warn!(
            pod_id = %placement.pod.id,
            name = %placement.pod.name,
            ambiguous_creates,
            unseen,
            "RunPod may hold more pods with this name than its list shows; look again later"
        );
        placement.possibly_duplicated = true;
    }
    placement
}

fn unsettled(error: ApiError) -> PlacementError {
    PlacementError::Unsettled(error)
}

fn attempt(candidate: &Candidate, error: ApiError) -> Attempt {
    Attempt {
        gpu_id: candidate.gpu_id.clone(),
        data_center_ids: candidate.data_center_ids.clone(),
        error,
    }
}
impl Placement {
    /// A create that was answered with the pod, for `candidate`, after `attempts` refused.
    fn made(pod: Pod, candidate: &Candidate, attempts: Vec<Attempt>) -> Placement {
        Placement {
            pod,
            candidate: Some(candidate.clone()),
            attempts,
            duplicates: Vec::new(),
            possibly_duplicated: false,
        }
    }
}

/// Every candidate refused: the pod itself is at fault when each refused it as a bad request
/// (more than one, so it is not one offer's rule), else there was no capacity.
fn exhausted(attempts: Vec<Attempt>) -> PlacementError {
    let all_rule_violations = attempts
        .iter()
        .all(|attempt| matches!(attempt.error, ApiError::BadRequest { .. }));
    match attempts.last() {
        Some(last) if all_rule_violations && attempts.len() > 1 => {
            PlacementError::RequestRejected {
                detail: last.error.to_string(),
                attempts,
            }
        }
        _ => PlacementError::NoCapacity { attempts },
    }
}
