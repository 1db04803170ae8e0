//! Every label, annotation and taint runpod-kubelet reads or writes, in one list with who may
//! write each and who reads it. `docs/reference/annotations.md` is rendered from it, and the
//! tests below keep it complete against the lists the webhook and the controller act on.

use crate::provider::{self, PROVIDER};
use crate::*;
use crate::{budget, gpus, teams, vastai};

/// Where a name lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Label,
    Annotation,
    Taint,
}

/// Who may set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// Whoever writes the pod or its Job.
    User,
    /// The platform team: namespace labels, `adopt`, `controller drain`.
    Operator,
    /// The admission webhook, at a pod's creation.
    Webhook,
    /// The controller only; the webhook removes these from new pods.
    Controller,
}

impl Writer {
    pub fn describe(self) -> &'static str {
        match self {
            Writer::User => "the pod's or Job's author",
            Writer::Operator => "the platform team",
            Writer::Webhook => "the webhook",
            Writer::Controller => "the controller only (removed from new pods)",
        }
    }
}

/// One name of the contract.
#[derive(Debug, Clone, Copy)]
pub struct Name {
    pub name: &'static str,
    pub kind: Kind,
    /// The objects it is put on, e.g. "pod, then its Job".
    pub on: &'static str,
    pub written_by: Writer,
    pub read_by: &'static str,
    /// Values the webhook accepts (empty: free text).
    pub values: &'static str,
    pub meaning: &'static str,
}

const fn user(name: &'static str, values: &'static str, meaning: &'static str) -> Name {
    Name {
        name,
        kind: Kind::Annotation,
        on: "pod, then its Job",
        written_by: Writer::User,
        read_by: "webhook (checked at admission), controller",
        values,
        meaning,
    }
}

const fn owned(name: &'static str, meaning: &'static str) -> Name {
    Name {
        name,
        kind: Kind::Annotation,
        on: "pod",
        written_by: Writer::Controller,
        read_by: "you (status); the controller trusts only its cloud's tags, never these",
        values: "",
        meaning,
    }
}

/// The whole contract, in the order the reference shows it.
pub const NAMES: &[Name] = &[
    Name {
        name: BURST_LABEL,
        kind: Kind::Label,
        on: "namespace or pod",
        written_by: Writer::Operator,
        read_by: "webhook (which pods it is sent), controller (runs only opted-in pods)",
        values: "`enabled`, `disabled` (pod only: never burst)",
        meaning: "opts a namespace's pods, or one pod, in",
    },
    Name {
        name: NAMESPACE_MODE_LABEL,
        kind: Kind::Label,
        on: "namespace",
        written_by: Writer::Operator,
        read_by: "webhook",
        values: "`fallback`, `always`, `delayed`, `never`",
        meaning: "the default burst mode of the namespace's pods",
    },
    Name {
        name: PROVIDER,
        kind: Kind::Label,
        on: "namespace",
        written_by: Writer::Operator,
        read_by: "webhook",
        values: "`runpod`, `vastai`, `cheapest`",
        meaning: "the default cloud of the namespace's pods",
    },
    Name {
        name: teams::NODE_LABEL,
        kind: Kind::Label,
        on: "namespace",
        written_by: Writer::Operator,
        read_by: "webhook (selects the node), controller (`WrongNode` elsewhere)",
        values: "a virtual node's name",
        meaning: "binds the namespace's burst pods to that node (and its cloud key)",
    },
    Name {
        name: budget::BUDGET_PER_HOUR,
        kind: Kind::Annotation,
        on: "namespace",
        written_by: Writer::Operator,
        read_by: "webhook (refuses what could never fit), controller (`BudgetExceeded`)",
        values: "USD per hour, e.g. `20` or `0.5`",
        meaning: "the most the namespace's burst pods may cost together, every node and cloud",
    },
    Name {
        name: interruptible::INTERRUPTIBLE,
        kind: Kind::Label,
        on: "namespace",
        written_by: Writer::Operator,
        read_by: "webhook (writes it on pods that say nothing)",
        values: "`true`, `false`",
        meaning: "the namespace's pods may run on Vast.ai interruptible bids",
    },
    Name {
        name: PORTS,
        kind: Kind::Label,
        on: "namespace",
        written_by: Writer::Operator,
        read_by: "webhook",
        values: "`none`",
        meaning: "pods of the namespace that name no ports expose none",
    },
    user(
        BURST_MODE,
        "`fallback`, `always`, `delayed`, `never`",
        "where the pod may run: local first then the cloud, the cloud only, local first then \
         the cloud after a wait, local only",
    ),
    user(
        PROVIDER,
        "`runpod`, `vastai`, `cheapest`",
        "which cloud; the webhook writes the choice (also `cheapest`'s) onto the pod",
    ),
    user(
        REQUIRED_GPU_MEMORY,
        "integer 1..1024",
        "minimum memory per GPU, GB",
    ),
    user(
        GPU_TYPES,
        "comma-separated, no empty item",
        "allowed GPU types in order of preference (RunPod's ids; on Vast.ai its names)",
    ),
    user(
        MAX_PRICE,
        "positive; at most `--max-gpu-price` × GPUs",
        "most USD per hour for the whole pod",
    ),
    user(
        CLOUD_TYPE,
        "`SECURE` (default), `COMMUNITY` (refused unless `--allowed-cloud-types` lists it)",
        "RunPod's cloud",
    ),
    user(
        DATACENTER_IDS,
        "comma-separated, within `--datacenter-ids`",
        "RunPod datacenters the pod may run in",
    ),
    user(
        PORTS,
        "`PORT/http` or `PORT/tcp`, comma-separated, each port once, at most 10 http; or `none`",
        "ports the cloud publishes (publicly); absent: detected from the container's ports",
    ),
    user(TEMPLATE_ID, "non-empty", "RunPod template id"),
    user(
        REGISTRY_AUTH_ID,
        "non-empty",
        "RunPod registry credential id, for a private image",
    ),
    user(DISK, "integer ≥ 1", "container disk, GB"),
    user(
        MANAGED,
        "`true`, `false`",
        "`true`: burst mode `delayed` when none is given (the Go job controller's opt-in)",
    ),
    user(
        OFFLOAD,
        "`true`, `false`",
        "`true`: go to the cloud now, even with a local GPU free (also when added to a waiting \
         pod's Job)",
    ),
    user(
        MAX_PENDING_TIME,
        "a duration (`40s`, `5m`) or whole seconds",
        "how long a `delayed` pod waits for a local GPU before it is offloaded (overrides \
         `--max-pending-time`)",
    ),
    Name {
        on: "pod",
        ..user(
            INIT_IN_MAIN_IMAGE,
            "`true`, `false`",
            "`true`: the pod's init containers run in its container's image, whatever image \
             they name (by default only those naming that image run; others are refused)",
        )
    },
    user(
        vastai::GPU_TYPE,
        "a Vast.ai GPU name",
        "Vast.ai GPU type (`RTX 4090`)",
    ),
    user(
        vastai::GPU_FALLBACKS,
        "comma-separated Vast.ai GPU names",
        "further acceptable Vast.ai GPU types",
    ),
    user(
        vastai::PRICE_MAX,
        "positive",
        "most USD per hour for the whole Vast.ai instance, storage included",
    ),
    user(
        interruptible::INTERRUPTIBLE,
        "`true`, `false`, or a bid ceiling in USD/h; only where the pod may go to Vast.ai",
        "the pod may run on a Vast.ai interruptible bid (cheaper; outbid, it fails with \
         `DisruptionTarget`)",
    ),
    user(
        interruptible::BID_PER_HOUR,
        "positive; opts the pod in",
        "the most the pod bids, USD per hour for the instance's compute",
    ),
    user(
        vastai::REGION,
        "`North America`, `South America`, `Europe`, `Asia`, `Oceania`, `Africa`, within \
         `--vastai-regions`",
        "Vast.ai region",
    ),
    user(
        vastai::MEMORY,
        "`24GB` (whole GB)",
        "minimum memory per GPU on Vast.ai",
    ),
    user(
        vastai::DISK,
        "`50GB` (whole GB)",
        "Vast.ai disk (default 20 GB)",
    ),
    owned(POD_ID, "the RunPod pod running this pod"),
    owned(vastai::INSTANCE_ID, "the Vast.ai instance running this pod"),
    owned(COST_PER_HR, "what the cloud bills for it, USD per hour"),
    owned(GPU_TYPE, "the GPU type it got"),
    owned(
        DATACENTER,
        "where it runs (RunPod datacenter, Vast.ai country)",
    ),
    owned(
        ENDPOINTS,
        "the public address of each published port (`8080/http=https://…,22/tcp=IP:PORT`)",
    ),
    owned(
        CREATE_REQUESTED,
        "when a create was sent: a restarted controller looks for the instance before creating",
    ),
    owned(
        ENDED,
        "how the container ended, written before its instance is terminated",
    ),
    owned(
        SSH_HOST_KEYS,
        "the SSH host keys the instance's container printed (read from the cloud's log): exec and port-forward connect to nothing else",
    ),
    Name {
        name: CHEAPEST_GPU_PRICE,
        kind: Kind::Annotation,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "webhook (price warnings, `cheapest`)",
        values: "`SECURE=0.34,COMMUNITY=0.22` (USD per GPU-hour)",
        meaning: "the cheapest GPU price the node's cloud offers inside the policy",
    },
    Name {
        name: gpus::GPU_PRICES,
        kind: Kind::Annotation,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "webhook (`cheapest`)",
        values: "`H100x1-8:SECURE=2.99,RTX4090x2=0.35,storage=0.0002,at=1795000000` (USD per GPU-hour; `storage` per GB-hour; `at` when, Unix seconds)",
        meaning: "per canonical GPU, GPU count and (RunPod) class, the lowest price inside the policy",
    },
    Name {
        name: crate::volumes::DATACENTER_GPUS,
        kind: Kind::Annotation,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "webhook (a network volume pod's price cap)",
        values: "`EU-RO-1=A100-80GB|H100,US-TX-3=L40S` (canonical GPU names)",
        meaning: "the GPU types each datacenter offers on Secure Cloud, where network volumes are",
    },
    Name {
        name: teams::SERVES_NAMESPACES,
        kind: Kind::Annotation,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "webhook and the other nodes' controllers (node binding)",
        values: "`team-a,team-a-dev` (empty: namespaces bound to no node)",
        meaning: "the namespaces the node serves (`--serve-namespaces`, the chart's `nodes[].namespaces`)",
    },
    Name {
        name: provider::CHEAPEST_CHOICE,
        kind: Kind::Annotation,
        on: "pod",
        written_by: Writer::Webhook,
        read_by: "controller (the `CheapestChosen` Event)",
        values: "`chose Vast.ai: RunPod H100 at 2.990 USD/h; Vast.ai H100 at 2.104 USD/h`",
        meaning: "which cloud `runpod.io/provider: cheapest` chose, and each cloud's price",
    },
    Name {
        name: budget::ledger::LEDGER_NAMESPACE,
        kind: Kind::Annotation,
        on: "ConfigMap (budget ledger)",
        written_by: Writer::Controller,
        read_by: "controllers and webhook (whose budget the ledger holds)",
        values: "a namespace",
        meaning: "the namespace a ledger `runpod-kubelet-budget-<namespace>` counts (names can be cut)",
    },
    Name {
        name: DRAINING_ANNOTATION,
        kind: Kind::Annotation,
        on: "virtual node",
        written_by: Writer::Operator,
        read_by: "controller (creates nothing more)",
        values: "a token",
        meaning: "set by `runpod-kubelet controller drain` (the chart's pre-delete hook)",
    },
    Name {
        name: DRAIN_ACK_ANNOTATION,
        kind: Kind::Annotation,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "`controller drain`",
        values: "the drain's token",
        meaning: "no create can start or is under way any more",
    },
    Name {
        name: PROVIDER_TAINT_KEY,
        kind: Kind::Label,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "webhook (node selector), scheduler",
        values: "`runpod`, `vastai`",
        meaning: "the node's cloud",
    },
    Name {
        name: NODE_TYPE_LABEL,
        kind: Kind::Label,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "webhook (node selector, preferred anti-affinity), scheduler",
        values: "`virtual-kubelet`",
        meaning: "marks virtual-kubelet nodes",
    },
    Name {
        name: PROVIDER_TAINT_KEY,
        kind: Kind::Taint,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "scheduler; the webhook adds the toleration",
        values: "`runpod:NoSchedule`, `vastai:NoSchedule` (and `:PreferNoSchedule`)",
        meaning: "keeps pods that did not opt in off the node",
    },
    Name {
        name: API_UNAVAILABLE_TAINT,
        kind: Kind::Taint,
        on: "virtual node",
        written_by: Writer::Controller,
        read_by: "scheduler",
        values: "`NoSchedule`",
        meaning: "the cloud's API is unusable (refused key, out of funds, unreachable)",
    },
];

/// The taint the controller puts on its node while its cloud's API is unusable.
pub const API_UNAVAILABLE_TAINT: &str = "runpod.io/api-unavailable";

#[cfg(test)]
mod tests {
    use super::*;

    fn find(name: &str, kind: Kind) -> Option<&'static Name> {
        NAMES
            .iter()
            .find(|entry| entry.name == name && entry.kind == kind && entry.on != "namespace")
    }

    #[test]
    fn every_user_annotation_is_listed_as_the_users() {
        for name in USER_ANNOTATIONS {
            let entry = find(name, Kind::Annotation).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(entry.written_by, Writer::User, "{name}");
        }
    }

    #[test]
    fn every_controller_annotation_is_listed_as_the_controllers() {
        for name in CONTROLLER_ANNOTATIONS {
            let entry = find(name, Kind::Annotation).unwrap_or_else(|| panic!("{name} missing"));
            assert!(
                matches!(entry.written_by, Writer::Controller | Writer::Webhook),
                "{name}"
            );
        }
    }

    #[test]
    fn every_pod_annotation_listed_is_one_the_webhook_knows() {
        for entry in NAMES
            .iter()
            .filter(|e| e.kind == Kind::Annotation && e.on.starts_with("pod"))
        {
            assert!(
                USER_ANNOTATIONS.contains(&entry.name)
                    || CONTROLLER_ANNOTATIONS.contains(&entry.name),
                "{} is listed but neither checked nor stripped by the webhook",
                entry.name
            );
        }
    }

    #[test]
    fn no_name_is_listed_twice_for_one_place() {
        for (i, a) in NAMES.iter().enumerate() {
            for b in &NAMES[i + 1..] {
                assert!(
                    !(a.name == b.name && a.kind == b.kind && a.on == b.on),
                    "{} twice",
                    a.name
                );
            }
        }
    }
}
