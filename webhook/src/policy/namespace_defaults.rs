//! What a namespace's labels default for its pods when the pod and its Job say nothing: the
//! burst mode and whether pods naming no ports expose none.

use std::collections::BTreeMap;

use runpod_contract::checks;
use runpod_contract::config::PolicyConfig;

use crate::contract::{self, BurstMode};

/// An explicit mode (pod, then Job) wins; then `runpod.io/managed: "true"` (the seed job
/// controller's opt-in) selects `delayed`; then the namespace label; then `fallback`.
pub(super) fn resolve_mode(
    explicit: Option<&checks::Sourced<'_>>,
    managed: bool,
    namespace_labels: &BTreeMap<String, String>,
    namespace: &str,
) -> Result<BurstMode, String> {
    let choices = || {
        BurstMode::ALL
            .iter()
            .map(|mode| mode.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(value) = explicit {
        return BurstMode::parse(value.value).ok_or_else(|| {
            format!(
                "{} {:?}{} is not one of {}",
                contract::BURST_MODE,
                value.value,
                value.origin(),
                choices()
            )
        });
    }
    if managed {
        return Ok(BurstMode::Delayed);
    }
    match namespace_labels.get(contract::NAMESPACE_MODE_LABEL) {
        None => Ok(BurstMode::Fallback),
        Some(value) => BurstMode::parse(value).ok_or_else(|| {
            format!(
                "namespace {namespace} has label {}={value:?}, which is not one of {}; \
                 fix the namespace label or set the pod annotation {}",
                contract::NAMESPACE_MODE_LABEL,
                choices(),
                contract::BURST_MODE
            )
        }),
    }
}

/// Whether a pod naming no ports exposes none: the namespace label `runpod.io/ports` (`none` or
/// `auto`), else the installation's `--expose-ports`.
pub(super) fn no_ports_by_default(
    namespace_labels: &BTreeMap<String, String>,
    namespace: &str,
    config: &PolicyConfig,
) -> Result<bool, String> {
    match namespace_labels
        .get(contract::PORTS)
        .map(|v| v.trim().to_ascii_lowercase())
    {
        None => Ok(config.expose_no_ports),
        Some(value) if value == contract::PORTS_NONE => Ok(true),
        Some(value) if value == "auto" => Ok(false),
        Some(value) => Err(format!(
            "namespace {namespace} has label {}={value:?}; a namespace label can say only \
             {} (expose no port) or auto (the pods' declared ports): fix the label",
            contract::PORTS,
            contract::PORTS_NONE
        )),
    }
}
