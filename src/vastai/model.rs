//! Vast.ai's wire shapes as the official clients read them (where the OpenAPI document
//! disagrees, the clients win: `env` is an object, `ports` a map with string host ports).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use runpod_contract::interruptible::Interruptible;
use runpod_contract::{PortProtocol, PortSpec};

/// One search row: the fields the client decides on. Unknown fields are ignored; missing
/// optional ones read as absent (and fail the re-check where they matter).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Offer {
    /// What a create buys.
    pub id: u64,
    #[serde(default)]
    pub machine_id: Option<u64>,
    #[serde(default)]
    pub host_id: Option<u64>,
    #[serde(default)]
    pub gpu_name: String,
    #[serde(default)]
    pub num_gpus: u32,
    /// Per-GPU VRAM in MB.
    #[serde(default)]
    pub gpu_ram: f64,
    /// USD/h for the whole offer with the searched disk priced in.
    #[serde(default)]
    pub dph_total: f64,
    /// USD/h for the GPUs alone (`dph_total` less the disk).
    #[serde(default)]
    pub dph_base: Option<f64>,
    /// USD per GB-month of disk (a month is 720 hours).
    #[serde(default)]
    pub storage_cost: Option<f64>,
    #[serde(default)]
    pub reliability: Option<f64>,
    #[serde(default)]
    pub reliability2: Option<f64>,
    /// `verified`, `unverified`, `deverified` (the `verified` filter is a virtual column).
    #[serde(default)]
    pub verification: Option<String>,
    /// 1 = datacenter tier (the `datacenter` filter is a virtual column).
    #[serde(default)]
    pub hosting_type: Option<i64>,
    #[serde(default)]
    pub geolocation: Option<String>,
    #[serde(default)]
    pub rentable: Option<bool>,
    #[serde(default)]
    pub rented: Option<bool>,
    /// GB free on the machine.
    #[serde(default)]
    pub disk_space: Option<f64>,
    /// Host RAM, MB.
    #[serde(default)]
    pub cpu_ram: Option<f64>,
    /// CPU cores the instance gets.
    #[serde(default)]
    pub cpu_cores_effective: Option<f64>,
    /// Seconds of rental left.
    #[serde(default)]
    pub duration: Option<f64>,
    /// The lowest bid that rents the machine as an interruptible instance, USD/h.
    #[serde(default)]
    pub min_bid: Option<f64>,
}

impl Offer {
    /// The reliability the filters use (`reliability2`, else `reliability`).
    pub fn reliability(&self) -> Option<f64> {
        self.reliability2.or(self.reliability)
    }

    /// The ISO country code ending the host's free-text location.
    pub fn country(&self) -> Option<String> {
        self.geolocation.as_deref().and_then(country_code)
    }
}

/// The two-letter code after the last comma of a geolocation (`Texas, US`, `, US`, `US`);
/// `None` when there is none: such a host counts as outside any country policy.
pub fn country_code(geolocation: &str) -> Option<String> {
    let last = geolocation.rsplit(',').next()?.trim();
    (last.len() == 2 && last.chars().all(|c| c.is_ascii_alphabetic()))
        .then(|| last.to_ascii_uppercase())
}

#[derive(Debug, Deserialize)]
pub(crate) struct SearchReply {
    pub offers: Vec<Offer>,
}

/// A registry login, sent as `image_login` (`-u USER -p TOKEN HOST`).
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryLogin {
    user: String,
    token: String,
    host: String,
}

impl RegistryLogin {
    /// Each part must be non-empty and free of whitespace, or the flag string would split
    /// differently on the host.
    pub fn new(user: &str, token: &str, host: &str) -> Result<RegistryLogin, String> {
        for (what, part) in [("user", user), ("token", token), ("registry host", host)] {
            if part.is_empty() || part.chars().any(char::is_whitespace) {
                return Err(format!(
                    "the registry {what} is empty or contains whitespace"
                ));
            }
        }
        Ok(RegistryLogin {
            user: user.to_owned(),
            token: token.to_owned(),
            host: host.to_owned(),
        })
    }

    fn flag(&self) -> String {
        format!("-u {} -p {} {}", self.user, self.token, self.host)
    }
}

impl fmt::Debug for RegistryLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RegistryLogin({}@{}, <token redacted>)",
            self.user, self.host
        )
    }
}

/// What to create on an offer. The body always carries `cancel_unavail: true` (an unstartable
/// machine answers an error instead of leaving a stopped instance that bills storage) and
/// `runtype: args` (the image's own entrypoint, no SSH daemon).
#[derive(Clone, PartialEq)]
pub struct CreateRequest {
    pub image: String,
    /// GB, at least 8; fixed for the instance's life.
    pub disk_gb: u32,
    /// The ownership marker (see [`super::label::Label`]), set in the create itself.
    pub label: String,
    pub env: BTreeMap<String, String>,
    /// Container ports to open, sent as `-p N:N` env keys.
    pub ports: Vec<PortSpec>,
    /// Replaces the image's entrypoint (sent as `onstart` in `args` mode).
    pub entrypoint: Option<String>,
    /// Replaces the image's CMD.
    pub args: Option<Vec<String>>,
    pub registry: Option<RegistryLogin>,
    /// Set: an interruptible pod, bid per offer within its ceiling (see
    /// [`CreateRequest::priced_for`]).
    pub interruptible: Option<Interruptible>,
    /// The bid sent (`price`, USD/h); `None`: on-demand.
    pub price: Option<f64>,
    /// The pod's cap for the whole instance (USD/h, storage included): a bid never takes the
    /// instance over it.
    pub price_cap: Option<f64>,
}

/// The smallest disk Vast.ai accepts.
pub const MIN_DISK_GB: u32 = 8;

impl CreateRequest {
    /// The request for `offer`: on-demand as it is, or an interruptible pod's bid a little over
    /// the offer's minimum within the pod's ceiling; `None` when that offer cannot be had on a
    /// bid this pod allows (no minimum shown, or one over the ceiling).
    pub fn priced_for(&self, offer: &Offer) -> Option<CreateRequest> {
        let Some(asked) = self.interruptible else {
            return Some(self.clone());
        };
        let min_bid = offer.min_bid?;
        // A bid search prices `dph_total` at the minimum bid: the rest is the disk's.
        let storage = (offer.dph_total - min_bid).max(0.0);
        let ceiling = match (asked.max_bid, self.price_cap.map(|cap| cap - storage)) {
            (Some(bid), Some(room)) => Some(bid.min(room)),
            (bid, room) => bid.or(room),
        };
        let price = runpod_contract::interruptible::bid_for(min_bid, ceiling)?;
        Some(CreateRequest {
            price: Some(price),
            ..self.clone()
        })
    }

    /// The JSON body of `PUT /api/v0/asks/{id}/`.
    pub fn body(&self) -> serde_json::Value {
        let mut env: serde_json::Map<String, serde_json::Value> = self
            .env
            .iter()
            .map(|(key, value)| (key.clone(), value.clone().into()))
            .collect();
        for port in &self.ports {
            // HTTP ports are plain TCP on Vast.ai (no proxy).
            let key = match port.protocol {
                PortProtocol::Http | PortProtocol::Tcp => format!("-p {0}:{0}", port.port),
            };
            env.insert(key, "1".into());
        }
        let body = CreateBody {
            client_id: "me",
            image: &self.image,
            disk: self.disk_gb.max(MIN_DISK_GB),
            label: &self.label,
            env,
            runtype: "args",
            onstart: self.entrypoint.as_deref(),
            args: self.args.as_deref(),
            image_login: self.registry.as_ref().map(RegistryLogin::flag),
            price: self.price,
            cancel_unavail: true,
        };
        serde_json::to_value(body).unwrap_or_default()
    }
}

/// Env values can be secrets: `Debug` shows the names only.
impl fmt::Debug for CreateRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateRequest")
            .field("image", &self.image)
            .field("disk_gb", &self.disk_gb)
            .field("label", &self.label)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("ports", &self.ports)
            .field("entrypoint", &self.entrypoint)
            .field("args", &self.args.as_ref().map(Vec::len))
            .field("registry", &self.registry)
            .field("price", &self.price)
            .finish()
    }
}

#[derive(Serialize)]
struct CreateBody<'a> {
    client_id: &'static str,
    image: &'a str,
    disk: u32,
    label: &'a str,
    env: serde_json::Map<String, serde_json::Value>,
    runtype: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    onstart: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image_login: Option<String>,
    /// The bid of an interruptible instance; absent: on-demand.
    #[serde(skip_serializing_if = "Option::is_none")]
    price: Option<f64>,
    cancel_unavail: bool,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CreateReply {
    #[serde(default)]
    pub success: Option<bool>,
    #[serde(default)]
    pub new_contract: Option<u64>,
    #[serde(default)]
    pub msg: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

/// Where an instance is, from `actual_status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceState {
    /// `null`: the contract is being provisioned.
    Provisioning,
    Created,
    Loading,
    Running,
    Rebooting,
    /// Halted; storage still bills.
    Stopped,
    /// Paused with memory; the GPU still bills.
    Frozen,
    Exited,
    Unknown,
    Offline,
    /// A value this client does not know: read as pending, with a timeout by the caller.
    Other(String),
}

impl InstanceState {
    pub fn parse(actual_status: Option<&str>) -> InstanceState {
        match actual_status {
            None => InstanceState::Provisioning,
            Some("created") => InstanceState::Created,
            Some("loading") => InstanceState::Loading,
            Some("running") => InstanceState::Running,
            Some("rebooting") => InstanceState::Rebooting,
            Some("stopped") => InstanceState::Stopped,
            Some("frozen") => InstanceState::Frozen,
            Some("exited") => InstanceState::Exited,
            Some("unknown") => InstanceState::Unknown,
            Some("offline") => InstanceState::Offline,
            Some(other) => InstanceState::Other(other.to_owned()),
        }
    }
}

/// One host port binding (`HostPort` is a string on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PortBinding {
    #[serde(rename = "HostIp", default)]
    pub host_ip: Option<String>,
    #[serde(rename = "HostPort")]
    pub host_port: String,
}

/// An instance as get and list show it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Instance {
    pub id: u64,
    /// The host machine.
    #[serde(default)]
    pub machine_id: Option<u64>,
    /// An interruptible instance (rented on a bid).
    #[serde(default)]
    pub is_bid: Option<bool>,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub actual_status: Option<String>,
    #[serde(default)]
    pub intended_status: Option<String>,
    /// The contract: `running`, `stopped`, or `unloaded` once destroyed.
    #[serde(default)]
    pub cur_state: Option<String>,
    #[serde(default)]
    pub status_msg: Option<String>,
    #[serde(default)]
    pub public_ipaddr: Option<String>,
    /// `"8080/tcp"` → bindings; present while running (a key may map to null).
    #[serde(default)]
    pub ports: Option<BTreeMap<String, Option<Vec<PortBinding>>>>,
    /// USD/h with storage.
    #[serde(default)]
    pub dph_total: Option<f64>,
    #[serde(default)]
    pub gpu_name: Option<String>,
    #[serde(default)]
    pub num_gpus: Option<u32>,
    #[serde(default)]
    pub geolocation: Option<String>,
    /// Epoch seconds.
    #[serde(default)]
    pub start_date: Option<f64>,
    /// The live report while running: CPU and GPU utilization as fractions, memory in MB.
    #[serde(default)]
    pub cpu_util: Option<f64>,
    #[serde(default)]
    pub gpu_util: Option<f64>,
    #[serde(default)]
    pub mem_usage: Option<f64>,
    #[serde(default)]
    pub mem_limit: Option<f64>,
}

impl Instance {
    pub fn state(&self) -> InstanceState {
        InstanceState::parse(self.actual_status.as_deref())
    }

    /// An instance that will never run: `exited`, `unknown`, `offline` (the docs: destroy it
    /// and buy elsewhere), or `created` with an OCI runtime error.
    pub fn is_dead(&self) -> bool {
        match self.state() {
            InstanceState::Exited | InstanceState::Unknown | InstanceState::Offline => true,
            InstanceState::Created => self
                .status_msg
                .as_deref()
                .is_some_and(|message| message.contains("OCI runtime create failed")),
            _ => false,
        }
    }

    /// `container port/proto` → `IP:PORT` for every published port.
    pub fn endpoints(&self) -> BTreeMap<String, String> {
        let ip = self.public_ipaddr.as_deref().map(str::trim).unwrap_or("");
        self.ports
            .iter()
            .flatten()
            .filter_map(|(port, bindings)| {
                let binding = bindings.as_ref()?.first()?;
                let host_port = binding.host_port.trim();
                (!ip.is_empty() && host_port.parse::<u16>().is_ok())
                    .then(|| (port.clone(), format!("{ip}:{host_port}")))
            })
            .collect()
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct GetReply {
    #[serde(default)]
    pub instances: Option<Instance>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListPage {
    /// Rows as they came: each is read on its own, so one odd row of another tool's cannot
    /// break the list of ours.
    #[serde(default)]
    pub instances: Vec<serde_json::Value>,
    #[serde(default)]
    pub next_token: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct LogsReply {
    #[serde(default)]
    pub result_url: Option<String>,
    #[serde(default)]
    pub msg: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request() -> CreateRequest {
        CreateRequest {
            image: "org/app:1".into(),
            disk_gb: 4,
            label: "rpk:c:n:u".into(),
            env: BTreeMap::from([("TOKEN".to_owned(), "s3cr3t".to_owned())]),
            ports: vec![
                PortSpec {
                    port: 8080,
                    protocol: PortProtocol::Http,
                },
                PortSpec {
                    port: 22,
                    protocol: PortProtocol::Tcp,
                },
            ],
            entrypoint: Some("bash".into()),
            args: Some(vec!["-c".into(), "echo hi".into()]),
            registry: Some(RegistryLogin::new("me", "tok3n", "ghcr.io").unwrap()),
            interruptible: None,
            price: None,
            price_cap: None,
        }
    }

    #[test]
    fn the_create_body_is_what_the_clients_send() {
        let body = request().body();
        assert_eq!(
            body,
            json!({
                "client_id": "me", "image": "org/app:1", "disk": 8, "label": "rpk:c:n:u",
                "env": {"TOKEN": "s3cr3t", "-p 8080:8080": "1", "-p 22:22": "1"},
                "runtype": "args", "onstart": "bash", "args": ["-c", "echo hi"],
                "image_login": "-u me -p tok3n ghcr.io", "cancel_unavail": true
            })
        );
        let debug = format!("{:?}", request());
        assert!(
            !debug.contains("s3cr3t") && !debug.contains("tok3n"),
            "{debug}"
        );
        assert!(RegistryLogin::new("me", "to ken", "ghcr.io").is_err());
        assert!(RegistryLogin::new("", "t", "ghcr.io").is_err());
    }

    #[test]
    fn an_interruptible_request_bids_per_offer_within_its_ceiling() {
        let offer: Offer =
            serde_json::from_value(json!({"id": 5, "dph_total": 0.25, "min_bid": 0.2})).unwrap();
        let on_demand = request().priced_for(&offer).unwrap();
        assert_eq!(on_demand.price, None);
        assert!(on_demand.body().get("price").is_none());
        let bidding = CreateRequest {
            interruptible: Some(Interruptible { max_bid: None }),
            ..request()
        };
        let priced = bidding.priced_for(&offer).unwrap();
        assert_eq!(priced.price, Some(0.22));
        assert_eq!(priced.body()["price"], json!(0.22));
        let capped = CreateRequest {
            interruptible: Some(Interruptible {
                max_bid: Some(0.19),
            }),
            ..request()
        };
        assert!(
            capped.priced_for(&offer).is_none(),
            "ceiling under the minimum"
        );
        let unpriced: Offer = serde_json::from_value(json!({"id": 6})).unwrap();
        assert!(
            bidding.priced_for(&unpriced).is_none(),
            "no minimum bid shown"
        );
    }

    #[test]
    fn instances_read_states_ports_and_death() {
        let instance: Instance = serde_json::from_value(json!({
            "id": 7, "actual_status": "running", "public_ipaddr": "203.0.113.10\n",
            "ports": {"8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40123"}], "22/tcp": null},
            "extra_env": [["A", "1"]]
        }))
        .unwrap();
        assert_eq!(instance.state(), InstanceState::Running);
        assert_eq!(
            instance.endpoints(),
            BTreeMap::from([("8080/tcp".to_owned(), "203.0.113.10:40123".to_owned())])
        );
        let parse = |status: Option<&str>, message: &str| Instance {
            actual_status: status.map(str::to_owned),
            status_msg: Some(message.to_owned()),
            ..instance.clone()
        };
        assert!(parse(Some("exited"), "").is_dead());
        assert!(parse(Some("offline"), "").is_dead());
        assert!(parse(Some("created"), "OCI runtime create failed: x").is_dead());
        assert!(!parse(Some("created"), "").is_dead());
        assert!(!parse(None, "").is_dead());
        assert_eq!(parse(None, "").state(), InstanceState::Provisioning);
        assert_eq!(
            parse(Some("scheduling"), "").state(),
            InstanceState::Other("scheduling".into())
        );
    }

    #[test]
    fn country_codes() {
        assert_eq!(country_code("Texas, US").as_deref(), Some("US"));
        assert_eq!(country_code(", us").as_deref(), Some("US"));
        assert_eq!(country_code("JP").as_deref(), Some("JP"));
        assert_eq!(country_code("California, United States"), None);
    }
}
