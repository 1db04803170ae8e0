//! The annotation and label contract of runpod-kubelet, defined once for the webhook and the
//! controller: names, burst modes, and the parsers that both sides use so that what admission
//! accepts is exactly what the controller understands.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// Label (namespace or pod) that opts pods in (`enabled`) or a pod out (`disabled`).
pub const BURST_LABEL: &str = "runpod.io/burst";
pub const BURST_ENABLED: &str = "enabled";
pub const BURST_DISABLED: &str = "disabled";
/// Namespace label giving the default burst mode of its pods.
pub const NAMESPACE_MODE_LABEL: &str = "runpod.io/burst-mode";
/// Never touched, whatever `--exclude-namespaces` says: the cluster's own pods must never
/// depend on this webhook.
pub const SYSTEM_NAMESPACE: &str = "kube-system";

pub const REQUIRED_GPU_MEMORY: &str = "runpod.io/required-gpu-memory";
pub const GPU_TYPES: &str = "runpod.io/gpu-types";
pub const MAX_PRICE: &str = "runpod.io/max-price";
pub const CLOUD_TYPE: &str = "runpod.io/cloud-type";
pub const DATACENTER_IDS: &str = "runpod.io/datacenter-ids";
pub const PORTS: &str = "runpod.io/ports";
pub const TEMPLATE_ID: &str = "runpod.io/templateId";
pub const REGISTRY_AUTH_ID: &str = "runpod.io/container-registry-auth-id";
pub const DISK: &str = "runpod.io/disk";
pub const BURST_MODE: &str = "runpod.io/burst-mode";
/// The seed job controller's opt-in (`"true"`/`"false"`): selects [`BurstMode::Delayed`] when no
/// burst mode is given.
pub const MANAGED: &str = "runpod.io/managed";
/// `"true"`: go to RunPod now, even with a local GPU free (the webhook pins such pods at
/// creation; the offloader moves waiting pods whose Job gets it later).
pub const OFFLOAD: &str = "runpod.io/offload";
/// How long a `delayed` pod may wait for a local GPU before it is offloaded; see
/// [`parse_max_pending_time`].
pub const MAX_PENDING_TIME: &str = "runpod.io/max-pending-time";

/// `"true"`: the pod's init containers may run in its main container's image, whatever image
/// they name (a burst pod runs them in its one container, before the command).
pub const INIT_IN_MAIN_IMAGE: &str = "runpod.io/init-in-main-image";

/// Annotations a user may set on a pod or its owning Job; pod first, then Job.
pub const USER_ANNOTATIONS: [&str; 23] = [
    REQUIRED_GPU_MEMORY,
    GPU_TYPES,
    MAX_PRICE,
    CLOUD_TYPE,
    DATACENTER_IDS,
    PORTS,
    TEMPLATE_ID,
    REGISTRY_AUTH_ID,
    DISK,
    BURST_MODE,
    MANAGED,
    OFFLOAD,
    MAX_PENDING_TIME,
    INIT_IN_MAIN_IMAGE,
    crate::provider::PROVIDER,
    crate::vastai::GPU_TYPE,
    crate::vastai::GPU_FALLBACKS,
    crate::vastai::PRICE_MAX,
    crate::vastai::REGION,
    crate::vastai::MEMORY,
    crate::vastai::DISK,
    crate::interruptible::INTERRUPTIBLE,
    crate::interruptible::BID_PER_HOUR,
];

pub const POD_ID: &str = "runpod.io/pod-id";
pub const COST_PER_HR: &str = "runpod.io/cost-per-hr";
pub const GPU_TYPE: &str = "runpod.io/gpu-type";
pub const DATACENTER: &str = "runpod.io/datacenter";
/// Public address of each port: `8080/http=https://…,22/tcp=IP:PORT`.
pub const ENDPOINTS: &str = "runpod.io/endpoints";
/// The controller's record that a create was sent (RFC 3339 time): a restarted or new leader
/// searches for the pod instead of creating another until a later complete list shows none.
pub const CREATE_REQUESTED: &str = "runpod.io/create-requested";

/// The controller's record of how the container ended (JSON), written before its instance is
/// terminated: a controller that crashes in between finishes the pod the same way instead of
/// failing it, or creating it again.
pub const ENDED: &str = "runpod.io/ended";

/// The SSH host keys of the pod's instance, as its container printed them when its sshd started
/// (read through the cloud's authenticated log API): `<instance id>=SHA256:…[,SHA256:…]`.
/// `kubectl exec` and `port-forward` connect only to a server holding one of them, whichever
/// controller replica serves the request; written by the controller only (a user's value is
/// removed at admission).
pub const SSH_HOST_KEYS: &str = "runpod.io/ssh-host-keys";

/// The value of [`SSH_HOST_KEYS`].
pub fn format_host_keys(instance: &str, fingerprints: &[String]) -> String {
    format!("{instance}={}", fingerprints.join(","))
}

/// Reads [`SSH_HOST_KEYS`]: the instance and its fingerprints; `None` for anything else.
pub fn parse_host_keys(value: &str) -> Option<(String, Vec<String>)> {
    let (instance, keys) = value.trim().split_once('=')?;
    let keys: Vec<String> = keys
        .split(',')
        .map(str::trim)
        .filter(|key| key.starts_with("SHA256:") && key.len() > "SHA256:".len())
        .map(str::to_owned)
        .collect();
    (!instance.trim().is_empty() && !keys.is_empty()).then(|| (instance.trim().to_owned(), keys))
}

/// Annotations users may not write (the controller's, and the webhook's record of a `cheapest`
/// choice); the webhook removes them from new pods.
pub const CONTROLLER_ANNOTATIONS: [&str; 10] = [
    POD_ID,
    crate::vastai::INSTANCE_ID,
    COST_PER_HR,
    GPU_TYPE,
    DATACENTER,
    ENDPOINTS,
    CREATE_REQUESTED,
    ENDED,
    crate::provider::CHEAPEST_CHOICE,
    SSH_HOST_KEYS,
];

/// Node annotation where the controller publishes the cheapest GPU price per cloud type, in
/// USD per GPU-hour (`SECURE=0.34,COMMUNITY=0.22`); the webhook warns from it when a pod's price
/// cap is below the market.
pub const CHEAPEST_GPU_PRICE: &str = "runpod.io/cheapest-gpu-price";

/// The value of [`CHEAPEST_GPU_PRICE`].
pub fn format_cheapest_prices(prices: &[(String, f64)]) -> String {
    prices
        .iter()
        .map(|(cloud, price)| format!("{cloud}={price}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`CHEAPEST_GPU_PRICE`]; malformed entries are skipped (a warning is advice, never a
/// reason to refuse).
pub fn parse_cheapest_prices(value: &str) -> BTreeMap<String, f64> {
    value
        .split(',')
        .filter_map(|entry| {
            let (cloud, price) = entry.split_once('=')?;
            let price: f64 = price.trim().parse().ok()?;
            (price.is_finite() && price > 0.0).then(|| (cloud.trim().to_ascii_uppercase(), price))
        })
        .collect()
}

/// Node annotation set by `runpod-kubelet controller drain`: create nothing more for this node.
pub const DRAINING_ANNOTATION: &str = "runpod.io/draining";
/// Node annotation the leader sets once no create can start or is under way any more.
pub const DRAIN_ACK_ANNOTATION: &str = "runpod.io/drain-acknowledged";

/// The taint of the virtual node, and the toleration the webhook injects.
pub const PROVIDER_TAINT_KEY: &str = "virtual-kubelet.io/provider";
pub const PROVIDER_TAINT_VALUE: &str = "runpod";
/// Node label selecting virtual-kubelet nodes.
pub const NODE_TYPE_LABEL: &str = "type";
pub const NODE_TYPE_VALUE: &str = "virtual-kubelet";
/// Extended resource that marks a pod as a GPU pod.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// RunPod accepts at most this many HTTP ports per pod.
pub const MAX_HTTP_PORTS: usize = 10;

/// Where a pod runs: see the product's "Burst modes".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BurstMode {
    /// Local GPU nodes first, RunPod when none fits.
    Fallback,
    /// Always RunPod.
    Always,
    /// Never RunPod.
    Never,
    /// Local GPU nodes only, until the controller's offloader decides the wait is too long.
    Delayed,
}

impl BurstMode {
    /// In the order messages list them (`delayed` last: it came later).
    pub const ALL: [BurstMode; 4] = [
        BurstMode::Fallback,
        BurstMode::Always,
        BurstMode::Never,
        BurstMode::Delayed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BurstMode::Fallback => "fallback",
            BurstMode::Always => "always",
            BurstMode::Never => "never",
            BurstMode::Delayed => "delayed",
        }
    }

    /// Case-insensitive, surrounding blanks ignored.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str().eq_ignore_ascii_case(value))
    }
}

impl fmt::Display for BurstMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// RunPod cloud tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudType {
    Secure,
    Community,
}

impl CloudType {
    pub fn as_str(self) -> &'static str {
        match self {
            CloudType::Secure => "SECURE",
            CloudType::Community => "COMMUNITY",
        }
    }

    /// Case-insensitive, as the seed accepted it.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        [CloudType::Secure, CloudType::Community]
            .into_iter()
            .find(|cloud| cloud.as_str().eq_ignore_ascii_case(value))
    }

    /// [`CloudType::parse`], or a message naming the accepted values.
    pub fn parse_named(value: &str) -> Result<Self, String> {
        Self::parse(value).ok_or_else(|| format!("{value:?} is not SECURE or COMMUNITY"))
    }

    /// The tier of a pod that names none: `SECURE`, unless the installation allows only
    /// `COMMUNITY` (`allowed` empty: any).
    pub fn default_within(allowed: &[CloudType]) -> CloudType {
        if allowed.is_empty() || allowed.contains(&CloudType::Secure) {
            CloudType::Secure
        } else {
            CloudType::Community
        }
    }

    /// Whether the installation allows this tier (`allowed` empty: any).
    pub fn allowed_in(self, allowed: &[CloudType]) -> bool {
        allowed.is_empty() || allowed.contains(&self)
    }
}

/// `SECURE,COMMUNITY` for messages.
pub fn cloud_type_names(types: &[CloudType]) -> String {
    types
        .iter()
        .map(|cloud| cloud.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How RunPod exposes a container port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortProtocol {
    /// Through RunPod's HTTPS proxy.
    Http,
    /// As a public TCP port mapping.
    Tcp,
}

/// One entry of `runpod.io/ports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortSpec {
    pub port: u16,
    pub protocol: PortProtocol,
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let protocol = match self.protocol {
            PortProtocol::Http => "http",
            PortProtocol::Tcp => "tcp",
        };
        write!(f, "{}/{protocol}", self.port)
    }
}

/// Container ports RunPod exposes over HTTP when auto-detecting.
pub const WELL_KNOWN_HTTP_PORTS: [u16; 8] = [80, 443, 8080, 8000, 3000, 5000, 8888, 9000];

/// Auto-detection rule: well-known HTTP ports, or a port whose name starts with `http`.
pub fn detected_protocol(port: u16, name: Option<&str>) -> PortProtocol {
    let named_http = name.is_some_and(|n| n.to_ascii_lowercase().starts_with("http"));
    if named_http || WELL_KNOWN_HTTP_PORTS.contains(&port) {
        PortProtocol::Http
    } else {
        PortProtocol::Tcp
    }
}

/// Renders a port list in the `runpod.io/ports` syntax.
pub fn format_ports(ports: &[PortSpec]) -> String {
    ports
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Splits a comma-separated list, trimming items; `Err` names the position of an empty item.
pub fn split_list(value: &str) -> Result<Vec<&str>, String> {
    let items: Vec<&str> = value.split(',').map(str::trim).collect();
    if let Some(position) = items.iter().position(|item| item.is_empty()) {
        return Err(format!("item {} of {value:?} is empty", position + 1));
    }
    Ok(items)
}

/// The `runpod.io/ports` value (and namespace label value) that exposes no port at all.
pub const PORTS_NONE: &str = "none";

/// Whether a pod with these annotations exposes nothing public at all: its `runpod.io/ports`
/// says `none` (written by the webhook from the pod, its namespace or the installation), or it
/// names no ports on an installation started with `--expose-ports none`. Such a pod gets no
/// port of the controller's either (no `22/tcp`), so exec and port-forward cannot reach it.
pub fn exposes_nothing(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    installation_exposes_none: bool,
) -> bool {
    match annotations.and_then(|a| a.get(PORTS)) {
        Some(value) => value.trim().eq_ignore_ascii_case(PORTS_NONE),
        None => installation_exposes_none,
    }
}

/// What `kubectl exec` and `port-forward` say about a pod that exposes nothing.
pub fn exec_refused_for_none(namespace: &str, pod: &str) -> String {
    format!(
        "runpod-kubelet: pod {namespace}/{pod} exposes nothing public ({PORTS}: {PORTS_NONE}, \
         set on the pod, its namespace or the installation), so no SSH port was opened for \
         exec and port-forward; to allow them, give the pod the ports it publishes instead of \
         {PORTS_NONE:?} (22/tcp is then opened for this node's key only) and recreate it"
    )
}

/// Parses `runpod.io/ports`: `none`, or `PORT/http|tcp`, comma-separated, ports 1..65535, each
/// port once, at most [`MAX_HTTP_PORTS`] HTTP ports.
pub fn parse_ports(value: &str) -> Result<Vec<PortSpec>, String> {
    if value.trim().eq_ignore_ascii_case(PORTS_NONE) {
        return Ok(Vec::new());
    }
    if value.trim().is_empty() {
        return Err(format!(
            "it is empty; to expose no port, write {PORTS_NONE:?}"
        ));
    }
    let mut seen = BTreeSet::new();
    let mut ports = Vec::new();
    for item in split_list(value)? {
        let (number, protocol) = item
            .split_once('/')
            .ok_or_else(|| format!("{item:?} is not PORT/http or PORT/tcp"))?;
        let protocol = match protocol.trim().to_ascii_lowercase().as_str() {
            "http" => PortProtocol::Http,
            "tcp" => PortProtocol::Tcp,
            other => {
                return Err(format!(
                    "{item:?} has protocol {other:?}; RunPod exposes only http and tcp"
                ));
            }
        };
        let port = number
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|port| *port >= 1)
            .ok_or_else(|| format!("{item:?} has no port number between 1 and 65535"))?;
        if !seen.insert(port) {
            return Err(format!("port {port} is listed more than once"));
        }
        ports.push(PortSpec { port, protocol });
    }
    let http = ports
        .iter()
        .filter(|p| p.protocol == PortProtocol::Http)
        .count();
    if http > MAX_HTTP_PORTS {
        return Err(format!(
            "{http} http ports listed; RunPod allows at most {MAX_HTTP_PORTS}"
        ));
    }
    Ok(ports)
}

/// Parses `runpod.io/required-gpu-memory`: whole GB per GPU, 1..=1024.
pub fn parse_gpu_memory(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|gb| (1..=1024).contains(gb))
        .ok_or_else(|| format!("{value:?} is not a whole number of GB between 1 and 1024"))
}

/// Parses `runpod.io/max-price`: a positive USD-per-hour amount.
pub fn parse_price(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|price| price.is_finite() && *price > 0.0)
        .ok_or_else(|| format!("{value:?} is not a positive number of USD per hour"))
}

/// Parses `runpod.io/disk`: whole GB of container disk, at least 1.
pub fn parse_disk(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|gb| *gb >= 1)
        .ok_or_else(|| format!("{value:?} is not a whole number of GB (at least 1)"))
}

/// Parses [`MANAGED`] and [`OFFLOAD`]: exactly `true` or `false`, so that the webhook and the
/// controller never read one value two ways.
pub fn parse_flag(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{value:?} is not \"true\" or \"false\"")),
    }
}

/// Parses [`MAX_PENDING_TIME`]: a duration as humantime reads it (`40s`, `5m`, `1h30m`), or
/// bare whole seconds (`40`) as the seed's job controller accepted them.
pub fn parse_max_pending_time(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(value).map_err(|_| {
        format!(
            "{value:?} is not a duration such as 40s, 5m or 1h30m, nor whole seconds such as 40"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_parse_and_render_round_trip() {
        let ports = parse_ports("8080/http, 22/TCP").unwrap();
        assert_eq!(
            ports,
            vec![
                PortSpec {
                    port: 8080,
                    protocol: PortProtocol::Http
                },
                PortSpec {
                    port: 22,
                    protocol: PortProtocol::Tcp
                },
            ]
        );
        assert_eq!(format_ports(&ports), "8080/http,22/tcp");
    }

    #[test]
    fn host_keys_round_trip_and_junk_is_no_record() {
        let keys = vec!["SHA256:abc".to_owned(), "SHA256:def".to_owned()];
        let value = format_host_keys("pod-1", &keys);
        assert_eq!(parse_host_keys(&value), Some(("pod-1".to_owned(), keys)));
        for junk in [
            "",
            "pod-1",
            "pod-1=",
            "=SHA256:abc",
            "pod-1=MD5:ab",
            "pod-1=SHA256:",
        ] {
            assert_eq!(parse_host_keys(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn nothing_is_exposed_only_where_none_was_said() {
        let none: std::collections::BTreeMap<String, String> =
            [(PORTS.to_owned(), " None ".to_owned())].into();
        let some: std::collections::BTreeMap<String, String> =
            [(PORTS.to_owned(), "8080/http".to_owned())].into();
        assert!(exposes_nothing(Some(&none), false));
        assert!(
            !exposes_nothing(Some(&some), true),
            "the pod's own ports win"
        );
        assert!(exposes_nothing(None, true));
        assert!(!exposes_nothing(None, false));
        let message = exec_refused_for_none("ns", "p");
        assert!(message.contains("runpod.io/ports: none") && message.contains("to allow"));
    }

    #[test]
    fn none_exposes_no_port_and_empty_says_so() {
        assert_eq!(parse_ports("none"), Ok(Vec::new()));
        assert_eq!(parse_ports(" None "), Ok(Vec::new()));
        assert!(parse_ports("").unwrap_err().contains("\"none\""));
        assert!(parse_ports("none,80/http").is_err());
    }

    #[test]
    fn ports_reject_bad_entries() {
        for bad in [
            "",
            "8080",
            "0/tcp",
            "65536/tcp",
            "80/udp",
            "80/http,80/tcp",
            "a/http",
            "80/http,",
        ] {
            assert!(parse_ports(bad).is_err(), "{bad:?} should be rejected");
        }
        let eleven: Vec<String> = (1..=11).map(|p| format!("{p}/http")).collect();
        assert!(
            parse_ports(&eleven.join(","))
                .unwrap_err()
                .contains("at most 10")
        );
        let ten: Vec<String> = (1..=10).map(|p| format!("{p}/http")).collect();
        assert_eq!(parse_ports(&ten.join(",")).unwrap().len(), 10);
    }

    #[test]
    fn detection_uses_well_known_ports_and_names() {
        assert_eq!(detected_protocol(8888, None), PortProtocol::Http);
        assert_eq!(detected_protocol(22, None), PortProtocol::Tcp);
        assert_eq!(detected_protocol(7860, Some("http-ui")), PortProtocol::Http);
        assert_eq!(detected_protocol(7860, Some("grpc")), PortProtocol::Tcp);
    }

    #[test]
    fn scalar_annotations_have_bounds() {
        assert_eq!(parse_gpu_memory("24"), Ok(24));
        assert!(parse_gpu_memory("0").is_err());
        assert!(parse_gpu_memory("1025").is_err());
        assert!(parse_gpu_memory("24GB").is_err());
        assert_eq!(parse_price("0.5"), Ok(0.5));
        for bad in ["0", "-1", "NaN", "inf", "cheap"] {
            assert!(parse_price(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_disk("20"), Ok(20));
        assert!(parse_disk("0").is_err());
        assert_eq!(BurstMode::parse(" Always "), Some(BurstMode::Always));
        assert_eq!(BurstMode::parse("sometimes"), None);
        assert_eq!(CloudType::parse("community"), Some(CloudType::Community));
        assert_eq!(CloudType::parse("STANDARD"), None);
    }

    #[test]
    fn delayed_is_a_burst_mode() {
        assert_eq!(BurstMode::parse("Delayed"), Some(BurstMode::Delayed));
        assert_eq!(BurstMode::Delayed.to_string(), "delayed");
        assert!(BurstMode::ALL.contains(&BurstMode::Delayed));
    }

    #[test]
    fn flags_are_exactly_true_or_false() {
        assert_eq!(parse_flag("true"), Ok(true));
        assert_eq!(parse_flag("false"), Ok(false));
        for bad in ["", "yes", "1", "True", " true"] {
            assert!(parse_flag(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn max_pending_time_takes_durations_and_bare_seconds() {
        assert_eq!(parse_max_pending_time("40"), Ok(Duration::from_secs(40)));
        assert_eq!(parse_max_pending_time("0"), Ok(Duration::ZERO));
        assert_eq!(parse_max_pending_time("40s"), Ok(Duration::from_secs(40)));
        assert_eq!(parse_max_pending_time("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(
            parse_max_pending_time(" 1h30m "),
            Ok(Duration::from_secs(5400))
        );
        for bad in ["", "-5", "1.5", "five minutes", "5 parsecs", "m"] {
            assert!(parse_max_pending_time(bad).is_err(), "{bad:?}");
        }
    }
}
