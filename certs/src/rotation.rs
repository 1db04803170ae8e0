//! What a certificate rotation run has to do, decided from what is stored and the time: a pure
//! function, so every branch is tested without a cluster or a clock.
//!
//! The model is Kyverno's renewer: the serving certificate is renewed well before it expires; the
//! CA is renewed before it expires too, and the CA bundle the apiserver trusts keeps the previous
//! CA (until it expires) next to the new one, so a webhook replica still serving a certificate of
//! the old CA (its Secret volume not yet refreshed) keeps passing verification.

use std::time::Duration;

use crate::inspect::CertInfo;

/// How long certificates live and how early they are renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    pub ca_validity: Duration,
    /// The CA is replaced once less than this is left; the old one stays in the bundle.
    pub ca_renew_before: Duration,
    pub serving_validity: Duration,
    /// The serving certificate is replaced once less than this is left.
    pub serving_renew_before: Duration,
    /// Previous CAs kept in the bundle at most (the newest ones; expired ones always go).
    pub max_previous: usize,
}

impl Default for RotationPolicy {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Self {
            ca_validity: Duration::from_secs(730 * DAY),
            ca_renew_before: Duration::from_secs(90 * DAY),
            serving_validity: Duration::from_secs(90 * DAY),
            serving_renew_before: Duration::from_secs(30 * DAY),
            max_previous: 2,
        }
    }
}

/// A rotation asked for by an operator, due or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Force {
    #[default]
    Nothing,
    /// A new serving certificate.
    Serving,
    /// A new CA (and therefore a new serving certificate).
    Ca,
}

/// The current CA as stored.
#[derive(Debug, Clone)]
pub struct StoredCa {
    pub info: CertInfo,
    /// Its key parses and belongs to it.
    pub usable: bool,
}

/// The serving certificate as stored.
#[derive(Debug, Clone)]
pub struct StoredServing {
    pub info: CertInfo,
    /// Signed by the current CA.
    pub signed_by_current_ca: bool,
    /// Its names are exactly the wanted ones.
    pub names_match: bool,
    /// Its key parses and belongs to it.
    pub key_matches: bool,
    /// The bundle stored next to it (`ca.crt`), DER identities in order.
    pub bundle: Vec<Vec<u8>>,
}

/// Everything a run reads before deciding.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// `None` when there is no CA or it cannot be read.
    pub ca: Option<StoredCa>,
    /// The other CAs of the stored bundle.
    pub previous: Vec<CertInfo>,
    /// `None` when there is no serving certificate or it cannot be read.
    pub serving: Option<StoredServing>,
}

/// Why the CA changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaAction {
    Keep,
    /// There is none (first install), or it is unreadable.
    Create,
    /// It expires within `ca_renew_before` (or a rotation was forced): a new one, the old one
    /// stays trusted until it expires.
    Rotate,
}

/// What happens to the serving certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServingAction {
    Keep,
    /// A new certificate from the current CA.
    Issue(IssueReason),
    /// The certificate stays; only the bundle stored next to it changes.
    RefreshBundle,
}

/// Why a new serving certificate is issued (logged, and in the run's summary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueReason {
    Missing,
    NewCa,
    NotSignedByCurrentCa,
    NamesChanged,
    KeyMismatch,
    Expiring,
    Forced,
}

/// What to write, in this order: the CA Secret (when `ca` is not `Keep` or the bundle shrank),
/// the caBundle of the webhook configuration, then the serving Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ca: CaAction,
    /// Previous CAs to keep trusting, newest first; after a rotation the replaced CA is first.
    pub previous: Vec<CertInfo>,
    /// The CA Secret must be written (new CA, or the bundle changed).
    pub write_ca_secret: bool,
    pub serving: ServingAction,
}

impl Plan {
    /// Nothing is written: the run is a no-op (apart from re-injecting a reset caBundle).
    pub fn is_noop(&self) -> bool {
        !self.write_ca_secret && self.serving == ServingAction::Keep
    }
}

/// Decides a run. `now` is Unix seconds.
pub fn plan(observed: &Observed, policy: &RotationPolicy, now: i64, force: Force) -> Plan {
    let ca = match &observed.ca {
        None => CaAction::Create,
        Some(ca) if !ca.usable || ca.info.not_after <= now => CaAction::Create,
        Some(_) if force == Force::Ca => CaAction::Rotate,
        Some(ca) if due(&ca.info, policy.ca_renew_before, now) => CaAction::Rotate,
        Some(_) => CaAction::Keep,
    };

    let mut previous: Vec<CertInfo> = observed.previous.clone();
    if ca == CaAction::Rotate
        && let Some(current) = &observed.ca
    {
        previous.insert(0, current.info.clone());
    }
    previous.retain(|cert| cert.not_after > now);
    // Newest first; a stable sort keeps the replaced CA ahead of older ones with equal expiry.
    previous.sort_by_key(|cert| std::cmp::Reverse(cert.not_after));
    previous.dedup_by(|a, b| a.der == b.der);
    previous.truncate(policy.max_previous);
    let bundle_changed = previous
        .iter()
        .map(|c| &c.der)
        .ne(observed.previous.iter().map(|c| &c.der));
    let write_ca_secret = ca != CaAction::Keep || bundle_changed;

    let serving = match (&observed.serving, ca) {
        (_, CaAction::Create | CaAction::Rotate) => ServingAction::Issue(IssueReason::NewCa),
        (None, _) => ServingAction::Issue(IssueReason::Missing),
        (Some(serving), CaAction::Keep) => {
            if !serving.key_matches {
                ServingAction::Issue(IssueReason::KeyMismatch)
            } else if !serving.signed_by_current_ca {
                ServingAction::Issue(IssueReason::NotSignedByCurrentCa)
            } else if !serving.names_match {
                ServingAction::Issue(IssueReason::NamesChanged)
            } else if force == Force::Serving {
                ServingAction::Issue(IssueReason::Forced)
            } else if due(&serving.info, policy.serving_renew_before, now) {
                ServingAction::Issue(IssueReason::Expiring)
            } else if !bundle_matches(serving, observed.ca.as_ref(), &previous) {
                ServingAction::RefreshBundle
            } else {
                ServingAction::Keep
            }
        }
    };
    Plan {
        ca,
        previous,
        write_ca_secret,
        serving,
    }
}

/// How long a certificate issued now may live: never past the CA that signs it.
pub fn serving_lifetime(policy: &RotationPolicy, ca_not_after: i64, now: i64) -> Duration {
    let ca_left = u64::try_from(ca_not_after.saturating_sub(now)).unwrap_or(0);
    policy.serving_validity.min(Duration::from_secs(ca_left))
}

fn due(cert: &CertInfo, renew_before: Duration, now: i64) -> bool {
    let renew_before = i64::try_from(renew_before.as_secs()).unwrap_or(i64::MAX);
    now >= cert.not_after.saturating_sub(renew_before)
}

fn bundle_matches(
    serving: &StoredServing,
    current: Option<&StoredCa>,
    previous: &[CertInfo],
) -> bool {
    let wanted = current
        .map(|ca| &ca.info.der)
        .into_iter()
        .chain(previous.iter().map(|c| &c.der));
    wanted.eq(serving.bundle.iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 24 * 3600;
    const NOW: i64 = 1_800_000_000;

    fn cert(id: u8, not_after: i64) -> CertInfo {
        CertInfo {
            not_before: not_after - 365 * DAY,
            not_after,
            der: vec![id],
        }
    }

    fn healthy() -> Observed {
        let ca = cert(1, NOW + 400 * DAY);
        Observed {
            ca: Some(StoredCa {
                info: ca.clone(),
                usable: true,
            }),
            previous: Vec::new(),
            serving: Some(StoredServing {
                info: cert(2, NOW + 60 * DAY),
                signed_by_current_ca: true,
                names_match: true,
                key_matches: true,
                bundle: vec![ca.der],
            }),
        }
    }

    fn policy() -> RotationPolicy {
        RotationPolicy::default()
    }

    #[test]
    fn nothing_is_due_so_nothing_is_written() {
        let plan = plan(&healthy(), &policy(), NOW, Force::Nothing);
        assert!(plan.is_noop(), "{plan:?}");
        assert_eq!(plan.ca, CaAction::Keep);
    }

    #[test]
    fn first_install_creates_both() {
        let plan = plan(&Observed::default(), &policy(), NOW, Force::Nothing);
        assert_eq!(plan.ca, CaAction::Create);
        assert!(plan.write_ca_secret);
        assert_eq!(plan.serving, ServingAction::Issue(IssueReason::NewCa));
        assert!(plan.previous.is_empty());
    }

    #[test]
    fn serving_certificate_is_renewed_well_before_expiry_and_not_earlier() {
        let mut observed = healthy();
        let serving = observed.serving.as_mut().unwrap();
        serving.info.not_after = NOW + 30 * DAY + 1;
        assert!(plan(&observed, &policy(), NOW, Force::Nothing).is_noop());
        observed.serving.as_mut().unwrap().info.not_after = NOW + 30 * DAY;
        let plan = plan(&observed, &policy(), NOW, Force::Nothing);
        assert_eq!(plan.serving, ServingAction::Issue(IssueReason::Expiring));
        assert_eq!(plan.ca, CaAction::Keep);
        assert!(!plan.write_ca_secret);
    }

    #[test]
    fn ca_is_rotated_before_expiry_and_the_old_one_stays_in_the_bundle() {
        let mut observed = healthy();
        let old = cert(1, NOW + 90 * DAY);
        observed.ca.as_mut().unwrap().info = old.clone();
        let plan = plan(&observed, &policy(), NOW, Force::Nothing);
        assert_eq!(plan.ca, CaAction::Rotate);
        assert_eq!(plan.previous, vec![old]);
        assert!(plan.write_ca_secret);
        assert_eq!(plan.serving, ServingAction::Issue(IssueReason::NewCa));
    }

    #[test]
    fn an_expired_previous_ca_leaves_the_bundle_and_the_serving_secret_follows() {
        let mut observed = healthy();
        let expired = cert(7, NOW - 1);
        let live = cert(8, NOW + DAY);
        observed.previous = vec![live.clone(), expired.clone()];
        let serving = observed.serving.as_mut().unwrap();
        serving.bundle = vec![vec![1], vec![8], vec![7]];
        let plan = plan(&observed, &policy(), NOW, Force::Nothing);
        assert_eq!(plan.ca, CaAction::Keep);
        assert_eq!(plan.previous, vec![live]);
        assert!(plan.write_ca_secret);
        assert_eq!(plan.serving, ServingAction::RefreshBundle);
    }

    #[test]
    fn the_bundle_keeps_only_the_newest_previous_cas() {
        let mut observed = healthy();
        observed.previous = vec![cert(5, NOW + DAY), cert(6, NOW + 2 * DAY)];
        observed.ca.as_mut().unwrap().info = cert(1, NOW + 3 * DAY);
        let plan = plan(&observed, &policy(), NOW, Force::Nothing);
        assert_eq!(plan.ca, CaAction::Rotate);
        let kept: Vec<u8> = plan.previous.iter().map(|c| c.der[0]).collect();
        assert_eq!(kept, vec![1, 6]);
    }

    #[test]
    fn a_serving_certificate_that_does_not_fit_is_reissued() {
        type Breaker = fn(&mut StoredServing);
        let cases: [(Breaker, IssueReason); 3] = [
            (|s| s.key_matches = false, IssueReason::KeyMismatch),
            (
                |s| s.signed_by_current_ca = false,
                IssueReason::NotSignedByCurrentCa,
            ),
            (|s| s.names_match = false, IssueReason::NamesChanged),
        ];
        for (breaker, reason) in cases {
            let mut observed = healthy();
            breaker(observed.serving.as_mut().unwrap());
            let plan = plan(&observed, &policy(), NOW, Force::Nothing);
            assert_eq!(plan.serving, ServingAction::Issue(reason));
            assert_eq!(plan.ca, CaAction::Keep);
        }
        let mut observed = healthy();
        observed.serving = None;
        assert_eq!(
            plan(&observed, &policy(), NOW, Force::Nothing).serving,
            ServingAction::Issue(IssueReason::Missing)
        );
    }

    #[test]
    fn an_unusable_or_expired_ca_is_replaced_without_keeping_it() {
        let mut observed = healthy();
        observed.ca.as_mut().unwrap().usable = false;
        let plan_unusable = plan(&observed, &policy(), NOW, Force::Nothing);
        assert_eq!(plan_unusable.ca, CaAction::Create);
        assert!(plan_unusable.previous.is_empty());
        let mut observed = healthy();
        observed.ca.as_mut().unwrap().info.not_after = NOW;
        assert_eq!(
            plan(&observed, &policy(), NOW, Force::Nothing).ca,
            CaAction::Create
        );
    }

    #[test]
    fn forced_rotations() {
        let serving = plan(&healthy(), &policy(), NOW, Force::Serving);
        assert_eq!(serving.ca, CaAction::Keep);
        assert_eq!(serving.serving, ServingAction::Issue(IssueReason::Forced));
        let ca = plan(&healthy(), &policy(), NOW, Force::Ca);
        assert_eq!(ca.ca, CaAction::Rotate);
        assert_eq!(ca.previous.len(), 1);
    }

    #[test]
    fn a_rotated_state_is_stable() {
        // After a CA rotation is carried out, the next run finds nothing to do.
        let new_ca = cert(9, NOW + 730 * DAY);
        let old_ca = cert(1, NOW + 80 * DAY);
        let observed = Observed {
            ca: Some(StoredCa {
                info: new_ca.clone(),
                usable: true,
            }),
            previous: vec![old_ca.clone()],
            serving: Some(StoredServing {
                info: cert(10, NOW + 90 * DAY),
                signed_by_current_ca: true,
                names_match: true,
                key_matches: true,
                bundle: vec![new_ca.der, old_ca.der],
            }),
        };
        assert!(plan(&observed, &policy(), NOW + 60, Force::Nothing).is_noop());
    }

    #[test]
    fn serving_lifetime_never_outlives_the_ca() {
        let p = policy();
        assert_eq!(
            serving_lifetime(&p, NOW + 10 * DAY, NOW),
            Duration::from_secs(10 * 86400)
        );
        assert_eq!(
            serving_lifetime(&p, NOW + 400 * DAY, NOW),
            p.serving_validity
        );
        assert_eq!(serving_lifetime(&p, NOW - 1, NOW), Duration::ZERO);
    }
}
