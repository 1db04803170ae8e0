//! Instances and settings for the controller's unit tests.

use std::time::Duration;

use crate::controller::context::Settings;
use crate::provider::{Instance, InstanceState, Tags};

pub(crate) fn instance(id: &str, cluster: &str, node: &str, uid: Option<&str>) -> Instance {
    Instance {
        ssh: None,
        machine: None,
        disruption: None,
        id: id.into(),
        name: id.into(),
        tags: Tags {
            cluster_id: Some(cluster.into()),
            node_name: Some(node.into()),
            pod_uid: uid.map(str::to_owned),
        },
        state: InstanceState::Running,
        uptime_secs: None,
        cost_per_hour: Some(0.5),
        gpu_type: None,
        datacenter: None,
        endpoints: vec![],
        ip: None,
        created_at: None,
        started_at: None,
        message: None,
        usage: None,
    }
}

pub(crate) fn settings() -> Settings {
    Settings {
        node_name: "vr".into(),
        cluster_id: "c1".into(),
        host_ip: "127.0.0.1".into(),
        reconcile_interval: Duration::from_secs(10),
        provision_timeout: Duration::from_secs(900),
        create_settle: Duration::from_secs(30),
        outage_grace: Duration::from_secs(3600),
        admission: Default::default(),
        idle: Default::default(),
        key_source: "Secret ns/key".into(),
        adoption_namespace: "runpod-system".into(),
        exec: crate::controller::node::exec_key::ExecAccess::Off,
        ledger_namespace: "runpod-system".into(),
        serve_namespaces: Vec::new(),
        owner_deployment: None,
        drain_timeout: std::time::Duration::from_secs(600),
        network: Default::default(),
    }
}
