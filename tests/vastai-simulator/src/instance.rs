//! One instance: what the create asked for, its lifecycle as a pure function of its age and
//! what happened to it, its billing, and its JSON as `GET /api/v0/instances/{id}/` shows it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::scenario::{Behaviour, OfferSpec};

/// Hours in the month Vast.ai prices storage by.
pub(crate) const MONTH_HOURS: f64 = 720.0;

/// `actual_status` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// `null`: the contract is being provisioned.
    Provisioning,
    Created,
    Loading,
    Running,
    Stopped,
    Exited,
    Unknown,
    Offline,
}

impl Status {
    pub fn as_json(self) -> Value {
        match self {
            Status::Provisioning => Value::Null,
            other => Value::String(other.as_str().to_owned()),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Provisioning => "null",
            Status::Created => "created",
            Status::Loading => "loading",
            Status::Running => "running",
            Status::Stopped => "stopped",
            Status::Exited => "exited",
            Status::Unknown => "unknown",
            Status::Offline => "offline",
        }
    }
}

/// Lifecycle timings, from the scenario.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    pub provisioning: Duration,
    pub loading: Duration,
}

/// What a create asked for, after validation.
#[derive(Debug, Clone)]
pub(crate) struct Order {
    pub image: String,
    pub disk: f64,
    pub label: Option<String>,
    /// Plain variables (port keys excluded).
    pub env: BTreeMap<String, String>,
    /// `8080/tcp`, `5000/udp`, from the `-p` keys.
    pub ports: Vec<String>,
    pub runtype: String,
    pub onstart: Option<String>,
    pub args: Option<Vec<String>>,
    pub image_login: bool,
    /// `true`: created `stopped` (target_state, or an unstartable machine without
    /// `cancel_unavail`).
    pub stopped: bool,
    /// The bid (`price`, USD/h) of an interruptible instance; `None`: on-demand.
    pub bid: Option<f64>,
}

/// One instance, alive or destroyed.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    pub id: u64,
    pub offer: OfferSpec,
    pub order: Order,
    pub created: Instant,
    /// Epoch seconds of the create, for `start_date` and the ledger.
    pub created_epoch: f64,
    pub behaviour: Behaviour,
    pub logs: Vec<String>,
    pub host_ports: BTreeMap<String, u16>,
    /// Set by the control API (`offline`, `unknown`, `exited`...), wins over the timers.
    pub forced: Option<Status>,
    pub destroyed: Option<Instant>,
    pub destroyed_epoch: Option<f64>,
    /// Epoch seconds of the first stop (a stop request, or outbid): GPU billing ended then.
    pub stopped_epoch: Option<f64>,
    pub create_status: u16,
    /// Outbid (the control API's `outbid`): stopped while it still intends to run, as Vast.ai
    /// shows a bid that lost its machine; storage keeps billing.
    pub outbid: bool,
    pub gpu_cost: f64,
    pub storage_billed: f64,
    pub last_billed: Instant,
}

impl Instance {
    /// Where the instance is at `now`, with its `status_msg`.
    pub fn status(&self, now: Instant, timings: Timings) -> (Status, String) {
        if let Some(forced) = self.forced {
            let message = match forced {
                Status::Exited => "Container exited".to_owned(),
                Status::Offline => "host offline".to_owned(),
                Status::Unknown => "no heartbeat from host".to_owned(),
                other => other.as_str().to_owned(),
            };
            return (forced, message);
        }
        if self.outbid {
            return (Status::Stopped, "outbid".to_owned());
        }
        if self.order.stopped {
            return (Status::Stopped, "stopped".to_owned());
        }
        let age = now.saturating_duration_since(self.created);
        if age < timings.provisioning {
            return (Status::Provisioning, String::new());
        }
        let started = timings.provisioning + timings.loading;
        match &self.behaviour {
            Behaviour::OciError => (
                Status::Created,
                "Error response from daemon: OCI runtime create failed: exec: not found".to_owned(),
            ),
            Behaviour::LoadingForever => (Status::Loading, "Pulling image".to_owned()),
            _ if age < started => (Status::Loading, "Pulling image".to_owned()),
            Behaviour::Exit { after_ms, code }
                if age >= started + Duration::from_millis(*after_ms) =>
            {
                (Status::Exited, format!("Container exited with code {code}"))
            }
            _ => (Status::Running, "running".to_owned()),
        }
    }

    /// Epoch seconds when GPU billing ended, as far as it has: the first stop, the destroy, the
    /// container's own exit, or the create itself for a container that never starts.
    pub fn gpu_billing_ended(&self, timings: Timings) -> Option<f64> {
        let started = (timings.provisioning + timings.loading).as_secs_f64();
        let natural = match &self.behaviour {
            Behaviour::Exit { after_ms, .. } => {
                Some(self.created_epoch + started + Duration::from_millis(*after_ms).as_secs_f64())
            }
            Behaviour::OciError | Behaviour::LoadingForever => Some(self.created_epoch),
            Behaviour::Run => None,
        };
        [self.stopped_epoch, self.destroyed_epoch, natural]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }

    /// Storage USD/h for this instance's disk.
    pub fn storage_per_hour(&self) -> f64 {
        self.offer.storage_cost * self.order.disk / MONTH_HOURS
    }

    /// Compute USD/h: the bid of an interruptible instance, the offer's price otherwise.
    pub fn dph_base(&self) -> f64 {
        self.order.bid.unwrap_or(self.offer.dph_base)
    }

    /// `dph_total`: compute plus storage.
    pub fn dph_total(&self) -> f64 {
        self.dph_base() + self.storage_per_hour()
    }

    /// Bills the time since the last call: storage from create to destroy (stopped included,
    /// not while offline), compute only while running.
    pub fn bill(&mut self, now: Instant, timings: Timings) {
        let end = self.destroyed.map_or(now, |destroyed| destroyed.min(now));
        if end <= self.last_billed {
            return;
        }
        let hours = (end - self.last_billed).as_secs_f64() / 3600.0;
        let (status, _) = self.status(end, timings);
        if status != Status::Offline {
            self.storage_billed += self.storage_per_hour() * hours;
        }
        if status == Status::Running {
            self.gpu_cost += self.dph_base() * hours;
        }
        self.last_billed = end;
    }

    /// The instance as get and list show it.
    pub fn to_json(&self, now: Instant, timings: Timings) -> Value {
        let (status, message) = self.status(now, timings);
        let running = status == Status::Running;
        let intended = if self.order.stopped {
            "stopped"
        } else {
            "running"
        };
        let mut extra_env: Vec<Value> = self
            .order
            .env
            .iter()
            .map(|(key, value)| json!([key, value]))
            .collect();
        extra_env.extend(self.order.ports.iter().map(|port| {
            let (number, protocol) = port.split_once('/').unwrap_or((port, "tcp"));
            let key = if protocol == "udp" {
                format!("-p {number}:{number}/udp")
            } else {
                format!("-p {number}:{number}")
            };
            json!([key, "1"])
        }));
        let ports: serde_json::Map<String, Value> = if running {
            self.host_ports
                .iter()
                .map(|(port, host)| {
                    (
                        port.clone(),
                        json!([{"HostIp": "0.0.0.0", "HostPort": host.to_string()}]),
                    )
                })
                .collect()
        } else {
            serde_json::Map::new()
        };
        json!({
            "id": self.id,
            "machine_id": self.offer.machine_id,
            "host_id": self.offer.host_id,
            "label": self.order.label,
            "actual_status": status.as_json(),
            "intended_status": intended,
            "cur_state": intended,
            "next_state": intended,
            "status_msg": message,
            "image_uuid": self.order.image,
            "image_runtype": self.order.runtype,
            "extra_env": extra_env,
            // Hosts' addresses come with a trailing newline now and then.
            "public_ipaddr": format!("{}\n", self.offer.public_ipaddr),
            "local_ipaddrs": "10.0.0.2 172.17.0.1",
            "ssh_host": format!("ssh{}.vast.ai", self.offer.host_id % 10),
            "ssh_port": 20_000 + self.id % 10_000,
            "ports": ports,
            "start_date": self.created_epoch,
            "end_date": self.created_epoch + self.offer.duration,
            "dph_base": self.dph_base(),
            "dph_total": self.dph_total(),
            "storage_cost": self.offer.storage_cost,
            "storage_total_cost": self.storage_per_hour(),
            "inet_up_cost": 0.002,
            "inet_down_cost": 0.002,
            "disk_space": self.order.disk,
            "gpu_name": self.offer.gpu_name,
            "num_gpus": self.offer.num_gpus,
            "gpu_ram": self.offer.gpu_ram,
            "geolocation": self.offer.geolocation,
            "verification": self.offer.verification,
            "reliability2": self.offer.reliability,
            "is_bid": self.order.bid.is_some(),
            // The live report, while running: fractions and MB.
            "cpu_util": running.then(|| self.utilization("SIM_CPU_UTIL", 3)),
            "gpu_util": running.then(|| self.utilization("SIM_GPU_UTIL", 50)),
            "mem_usage": running.then(|| MEM_LIMIT_MB * self.utilization("SIM_MEM_UTIL", 20)),
            "mem_limit": running.then_some(MEM_LIMIT_MB),
        })
    }

    /// A utilization fraction the instance's env fixes in percent (`SIM_GPU_UTIL=73`), so tests
    /// can set what it reports; `default` percent otherwise.
    fn utilization(&self, key: &str, default: u32) -> f64 {
        let percent = self
            .order
            .env
            .get(key)
            .and_then(|value| value.trim().parse::<u32>().ok())
            .unwrap_or(default)
            .min(100);
        f64::from(percent) / 100.0
    }
}

/// Memory the simulated container may use, in MB.
const MEM_LIMIT_MB: f64 = 16_000.0;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::scenario::Scenario;

    pub(crate) fn instance(behaviour: Behaviour, stopped: bool) -> Instance {
        let now = Instant::now();
        Instance {
            id: 7,
            offer: Scenario::default().offers[0].clone(),
            order: Order {
                image: "img".into(),
                disk: 72.0,
                label: Some("l".into()),
                env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
                ports: vec!["8080/tcp".into()],
                runtype: "args".into(),
                onstart: None,
                args: None,
                image_login: false,
                stopped,
                bid: None,
            },
            created: now,
            created_epoch: 1.0e9,
            behaviour,
            logs: Vec::new(),
            host_ports: BTreeMap::from([("8080/tcp".to_owned(), 40_123)]),
            forced: None,
            destroyed: None,
            destroyed_epoch: None,
            stopped_epoch: None,
            create_status: 200,
            outbid: false,
            gpu_cost: 0.0,
            storage_billed: 0.0,
            last_billed: now,
        }
    }

    const T: Timings = Timings {
        provisioning: Duration::from_secs(1),
        loading: Duration::from_secs(2),
    };

    fn at(instance: &Instance, secs: u64) -> Instant {
        instance.created + Duration::from_secs(secs)
    }

    #[test]
    fn lifecycle_follows_the_timers_and_the_behaviour() {
        let run = instance(Behaviour::Run, false);
        assert_eq!(run.status(at(&run, 0), T).0, Status::Provisioning);
        assert_eq!(run.status(at(&run, 1), T).0, Status::Loading);
        assert_eq!(run.status(at(&run, 3), T).0, Status::Running);
        let stuck = instance(Behaviour::LoadingForever, false);
        assert_eq!(stuck.status(at(&stuck, 10_000), T).0, Status::Loading);
        let batch = instance(
            Behaviour::Exit {
                after_ms: 1_000,
                code: 3,
            },
            false,
        );
        assert_eq!(batch.status(at(&batch, 3), T).0, Status::Running);
        let (status, message) = batch.status(at(&batch, 4), T);
        assert_eq!(status, Status::Exited);
        assert_eq!(message, "Container exited with code 3");
        let oci = instance(Behaviour::OciError, false);
        assert!(
            oci.status(at(&oci, 60), T)
                .1
                .contains("OCI runtime create failed")
        );
        let stopped = instance(Behaviour::Run, true);
        assert_eq!(stopped.status(at(&stopped, 60), T).0, Status::Stopped);
    }

    #[test]
    fn storage_bills_while_stopped_and_compute_only_while_running() {
        let mut stopped = instance(Behaviour::Run, true);
        stopped.bill(at(&stopped, 3600), T);
        // 0.15 USD/GB/month × 72 GB / 720 h = 0.015 USD/h.
        assert!((stopped.storage_billed - 0.015).abs() < 1e-9);
        assert_eq!(stopped.gpu_cost, 0.0);
        let mut running = instance(Behaviour::Run, false);
        running.last_billed = at(&running, 3);
        running.bill(at(&running, 3603), T);
        assert!((running.gpu_cost - running.offer.dph_base).abs() < 1e-9);
        let mut offline = instance(Behaviour::Run, false);
        offline.forced = Some(Status::Offline);
        offline.bill(at(&offline, 3600), T);
        assert_eq!(offline.storage_billed + offline.gpu_cost, 0.0);
    }

    #[test]
    fn json_has_the_wire_shapes() {
        let run = instance(Behaviour::Run, false);
        let loading = run.to_json(at(&run, 1), T);
        assert_eq!(loading["actual_status"], "loading");
        assert_eq!(loading["ports"], json!({}), "ports only while running");
        let running = run.to_json(at(&run, 5), T);
        assert_eq!(running["ports"]["8080/tcp"][0]["HostPort"], "40123");
        assert_eq!(
            running["extra_env"],
            json!([["A", "1"], ["-p 8080:8080", "1"]])
        );
        assert!((running["dph_total"].as_f64().unwrap() - (0.40 + 0.015)).abs() < 1e-9);
        assert!(run.to_json(at(&run, 0), T)["actual_status"].is_null());
    }
}
