//! The market: offer search (`POST /api/v0/bundles/`) and buying an offer
//! (`PUT /api/v0/asks/{id}/`), with the create body validated as strictly as the notes allow.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::faults::Effect;
use crate::filter;
use crate::instance::{Instance, MONTH_HOURS, Order};
use crate::reply::Reply;
use crate::scenario::OfferSpec;
use crate::state::{Shared, World};

/// The lowest bid that rents `offer` as an interruptible instance (USD/h).
pub(crate) fn min_bid(offer: &OfferSpec) -> f64 {
    offer.dph_base * 0.6
}

/// A search row for `offer` with `allocated_storage` GB priced in.
pub(crate) fn row(offer: &OfferSpec, allocated_storage: f64, bid: bool) -> Map<String, Value> {
    let storage = offer.storage_cost * allocated_storage / MONTH_HOURS;
    let base = if bid { min_bid(offer) } else { offer.dph_base };
    let value = json!({
        "id": offer.id,
        "ask_contract_id": offer.id,
        "bundle_id": offer.id + 500_000,
        "machine_id": offer.machine_id,
        "host_id": offer.host_id,
        "gpu_name": offer.gpu_name,
        "num_gpus": offer.num_gpus,
        "gpu_ram": offer.gpu_ram,
        "gpu_total_ram": offer.gpu_ram * u64::from(offer.num_gpus),
        // Hosts differ: per GPU, 4 to 16 cores and 32 to 128 GB of RAM, by machine.
        "cpu_cores_effective": (4.0 * f64::from(1 + (offer.machine_id % 4) as u32)) * f64::from(offer.num_gpus),
        "cpu_ram": 32_000 * (1 + offer.machine_id % 4) * u64::from(offer.num_gpus),
        "disk_space": offer.disk_space,
        "dph_base": base,
        "dph_total": base + storage,
        "storage_cost": offer.storage_cost,
        "storage_total_cost": storage,
        "inet_up": offer.inet_up,
        "inet_down": offer.inet_down,
        "inet_up_cost": 0.002,
        "inet_down_cost": 0.002,
        "min_bid": min_bid(offer),
        "is_bid": bid,
        "reliability": offer.reliability,
        "reliability2": offer.reliability,
        "verification": offer.verification,
        "hosting_type": offer.hosting_type,
        "geolocation": offer.geolocation,
        "public_ipaddr": offer.public_ipaddr,
        "static_ip": true,
        "direct_port_count": offer.direct_port_count,
        "duration": offer.duration,
        "cuda_max_good": offer.cuda_max_good,
        "compute_cap": 890,
        "rentable": offer.rentable,
        "rented": false,
        "score": 100.0 - offer.dph_base,
        "search": {"gpuCostPerHour": base / f64::from(offer.num_gpus), "diskHour": storage, "totalHour": base + storage},
    });
    value.as_object().cloned().unwrap_or_default()
}

/// `POST /api/v0/bundles/`.
pub(crate) fn search(world: &World, body: &[u8]) -> Reply {
    let value: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(error) => {
            return Reply::error(400, "invalid_request", format!("body is not JSON: {error}"));
        }
    };
    let search = match filter::parse(&value) {
        Ok(search) => search,
        Err(problem) => return Reply::error(400, "invalid_request", problem),
    };
    let rows = world
        .offers
        .values()
        .filter(|offer| !world.gone.contains(&offer.id))
        .map(|offer| row(offer, search.allocated_storage, search.bid))
        .collect();
    let offers: Vec<Value> = search.apply(rows).into_iter().map(Value::Object).collect();
    Reply::ok(json!({ "offers": offers }))
}

/// A validated create body.
#[derive(Debug, Clone)]
pub(crate) struct CreateBody {
    pub order: Order,
    pub cancel_unavail: bool,
}

const CREATE_FIELDS: [&str; 14] = [
    "client_id",
    "image",
    "disk",
    "label",
    "env",
    "runtype",
    "args",
    "args_str",
    "onstart",
    "image_login",
    "price",
    "cancel_unavail",
    "target_state",
    "template_hash_id",
];

const RUNTYPES: [&str; 9] = [
    "args",
    "ssh",
    "ssh_proxy",
    "ssh_direct",
    "ssh_direc",
    "jupyter",
    "jupyter_proxy",
    "jupyter_direct",
    "jupyter_direc",
];

/// Validates a create body; `Err` is the message of a 400 `invalid_args`. An absent
/// `cancel_unavail` is read as `false`, the reading that leaves stopped instances billing.
pub(crate) fn parse_create(body: &Value) -> Result<CreateBody, String> {
    let object = body.as_object().ok_or("the body must be a JSON object")?;
    if let Some(unknown) = object
        .keys()
        .find(|key| !CREATE_FIELDS.contains(&key.as_str()))
    {
        return Err(format!("unknown field {unknown:?}"));
    }
    let text = |key: &str| -> Result<Option<&str>, String> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(other) => Err(format!("{key} must be a string, not {other}")),
        }
    };
    if let Some(client) = text("client_id")?
        && client != "me"
    {
        return Err(format!("client_id {client:?} is not \"me\""));
    }
    let image = match (text("image")?, text("template_hash_id")?) {
        (Some(image), _) if !image.trim().is_empty() && image.len() <= 1024 => image.to_owned(),
        (Some(_), _) => return Err("image must be 1 to 1024 characters".into()),
        (None, Some(_)) => "template".to_owned(),
        (None, None) => return Err("image is required".into()),
    };
    let disk = match object.get("disk") {
        None => 8.0,
        Some(value) => value
            .as_f64()
            .filter(|gb| gb.is_finite() && *gb >= 8.0)
            .ok_or_else(|| format!("disk {value} is not a number of GB, at least 8"))?,
    };
    let label = text("label")?.map(str::to_owned);
    if label.as_ref().is_some_and(|label| label.len() > 256) {
        return Err("label_too_long: at most 256 characters at create".into());
    }
    let (env, ports) = parse_env(object.get("env"))?;
    let runtype = text("runtype")?.unwrap_or("ssh").to_owned();
    if runtype.split_whitespace().next().is_none()
        || !runtype
            .split_whitespace()
            .all(|token| RUNTYPES.contains(&token))
    {
        return Err(format!(
            "runtype {runtype:?} is not one of {}",
            RUNTYPES.join(", ")
        ));
    }
    let args = match object.get("args") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map(str::to_owned)
                        .ok_or("args must be strings")
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(other) => return Err(format!("args must be an array of strings, not {other}")),
    };
    let onstart = text("onstart")?.map(str::to_owned);
    if onstart.as_ref().is_some_and(|script| script.len() > 4048) {
        return Err("onstart is longer than 4048 characters".into());
    }
    let command_length = onstart.as_ref().map_or(0, String::len)
        + text("args_str")?.map_or(0, str::len)
        + args
            .iter()
            .flatten()
            .map(|arg| arg.len() + 1)
            .sum::<usize>();
    if command_length > 4096 {
        return Err("args, args_str and onstart together exceed 4096 characters".into());
    }
    let image_login = match text("image_login")? {
        None => false,
        Some(login) => {
            let parts: Vec<&str> = login.split_whitespace().collect();
            let well_formed =
                matches!(parts.as_slice(), ["-u", _, "-p", _, _] | ["-u", _, "-p", _])
                    && login.split(' ').all(|part| !part.is_empty());
            if !well_formed {
                return Err("image_login must be \"-u USER -p TOKEN registry\"".into());
            }
            true
        }
    };
    let bid = match object.get("price") {
        None | Some(Value::Null) => None,
        Some(price) => Some(
            price
                .as_f64()
                .filter(|p| (0.001..=128.0).contains(p))
                .ok_or_else(|| format!("invalid_price: {price} is not between 0.001 and 128"))?,
        ),
    };
    let cancel_unavail = match object.get("cancel_unavail") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(other) => return Err(format!("cancel_unavail must be a boolean, not {other}")),
    };
    let stopped = match text("target_state")? {
        None | Some("running") => false,
        Some("stopped") => true,
        Some(other) => return Err(format!("target_state {other:?} is not running or stopped")),
    };
    Ok(CreateBody {
        order: Order {
            image,
            disk,
            label,
            env,
            ports,
            runtype,
            onstart,
            args,
            image_login,
            stopped,
            bid,
        },
        cancel_unavail,
    })
}

/// `env` is an object of strings; `-p N:N` and `-p N:N/udp` keys (value `"1"`) open ports.
fn parse_env(value: Option<&Value>) -> Result<(BTreeMap<String, String>, Vec<String>), String> {
    let mut env = BTreeMap::new();
    let mut ports = Vec::new();
    let Some(value) = value.filter(|value| !value.is_null()) else {
        return Ok((env, ports));
    };
    let object = value
        .as_object()
        .ok_or_else(|| format!("env must be a JSON object of strings, not {value}"))?;
    let mut total = 0;
    for (key, value) in object {
        let value = value
            .as_str()
            .ok_or_else(|| format!("env {key:?} must be a string"))?;
        if key.len() + value.len() > 256 {
            return Err(format!("env {key:?} is longer than 256 characters"));
        }
        total += key.len() + value.len();
        if let Some(mapping) = key.strip_prefix("-p ") {
            let (mapping, protocol) = match mapping.strip_suffix("/udp") {
                Some(rest) => (rest, "udp"),
                None => (mapping.strip_suffix("/tcp").unwrap_or(mapping), "tcp"),
            };
            let port = mapping
                .split_once(':')
                .and_then(|(outer, inner)| {
                    let inner = inner.parse::<u32>().ok()?;
                    (outer.parse::<u32>().ok()? == inner && (1..=65_535).contains(&inner))
                        .then_some(inner)
                })
                .ok_or_else(|| format!("port key {key:?} is not \"-p N:N\" or \"-p N:N/udp\""))?;
            if value != "1" {
                return Err(format!("port key {key:?} must have the value \"1\""));
            }
            ports.push(format!("{port}/{protocol}"));
        } else if key.is_empty() || key.starts_with('-') {
            return Err(format!("env name {key:?} is not a variable name"));
        } else {
            env.insert(key.clone(), value.to_owned());
        }
    }
    if total > 32_768 {
        return Err("env is larger than 32768 characters".into());
    }
    if ports.len() > 64 {
        return Err("at most 64 ports can be opened".into());
    }
    Ok((env, ports))
}

/// What a create did, for the router: the reply and how long to hold it.
pub(crate) struct Created {
    pub reply: Reply,
    pub delay: Duration,
}

/// `PUT /api/v0/asks/{id}/`: validation, the market, faults, then the instance.
pub(crate) fn create(
    shared: &Shared,
    world: &mut World,
    ask_id: u64,
    body: &[u8],
    effect: Option<Effect>,
) -> Created {
    let now = Instant::now();
    let plain = |reply: Reply| Created {
        reply,
        delay: Duration::ZERO,
    };
    let value: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(error) => return plain(Reply::invalid(format!("body is not JSON: {error}"))),
    };
    let parsed = match parse_create(&value) {
        Ok(parsed) => parsed,
        Err(problem) => return plain(Reply::invalid(problem)),
    };
    let Some(offer) = world
        .offers
        .get(&ask_id)
        .filter(|offer| offer.rentable && !world.gone.contains(&offer.id))
        .cloned()
    else {
        return plain(Reply::no_such_ask(404, ask_id));
    };
    if shared.scenario.credit <= 0.0 {
        return plain(Reply::error(
            402,
            "insufficient_credit",
            "Insufficient credits: add credit",
        ));
    }
    if effect == Some(Effect::NoSuchAsk) {
        world.gone.insert(ask_id);
        return plain(Reply::no_such_ask(404, ask_id));
    }
    let mut order = parsed.order;
    // A bid under the machine's minimum does not rent it.
    if let Some(bid) = order.bid
        && bid + 1e-9 < min_bid(&offer)
    {
        return plain(Reply::invalid(format!(
            "invalid_price: a bid of {bid} is under this offer's minimum bid of {:.4}",
            min_bid(&offer)
        )));
    }
    if !offer.startable {
        if parsed.cancel_unavail {
            return plain(Reply::no_such_ask(410, ask_id));
        }
        order.stopped = true;
    }
    world.gone.insert(ask_id);
    let id = world.next_id;
    world.next_id += 1 + world.rng.u64(0..3);
    let (behaviour, logs) = shared.scenario.behaviour(&order.image);
    let host_ports = order
        .ports
        .iter()
        .map(|port| (port.clone(), world.rng.u16(33_000..60_000)))
        .collect();
    let (status, delay) = match effect {
        Some(Effect::CreateThenFail { status }) => (status, Duration::ZERO),
        Some(Effect::CreateThenStall { millis }) => (200, Duration::from_millis(millis)),
        Some(Effect::Delay { millis }) => (200, Duration::from_millis(millis)),
        _ => (200, Duration::ZERO),
    };
    let created_epoch = shared.epoch(now);
    let order_stopped = order.stopped;
    world.instances.insert(
        id,
        Instance {
            id,
            offer,
            order,
            created: now,
            created_epoch,
            behaviour,
            logs,
            host_ports,
            forced: None,
            destroyed: None,
            destroyed_epoch: None,
            stopped_epoch: order_stopped.then_some(created_epoch),
            create_status: status,
            outbid: false,
            gpu_cost: 0.0,
            storage_billed: 0.0,
            last_billed: now,
        },
    );
    let reply = if status == 200 {
        let key: String = std::iter::repeat_with(|| world.rng.alphanumeric())
            .take(32)
            .collect();
        Reply::ok(json!({"success": true, "new_contract": id, "instance_api_key": key}))
    } else {
        Reply::error(status, "server_error", "Bad Gateway")
    };
    Created { reply, delay }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> Value {
        json!({
            "client_id": "me", "image": "org/img:1", "disk": 50, "label": "rpk:c:n:u",
            "env": {"A": "1", "-p 8080:8080": "1", "-p 5000:5000/udp": "1"},
            "runtype": "args", "args": ["-c", "echo hi"], "onstart": "bash",
            "image_login": "-u user -p token ghcr.io", "cancel_unavail": true
        })
    }

    #[test]
    fn a_valid_body_is_read_whole() {
        let body = parse_create(&valid()).unwrap();
        assert!(body.cancel_unavail);
        assert_eq!(body.order.ports, vec!["5000/udp", "8080/tcp"]);
        assert_eq!(body.order.env.len(), 1);
        assert_eq!(body.order.disk, 50.0);
        assert!(body.order.image_login);
        assert_eq!(body.order.label.as_deref(), Some("rpk:c:n:u"));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let with = |key: &str, value: Value| {
            let mut body = valid();
            body[key] = value;
            body
        };
        for bad in [
            with("disk", json!(4)),
            with("label", json!("x".repeat(257))),
            with("env", json!("-e A=1")),
            with("env", json!({"-p 8080": "1"})),
            with("env", json!({"-p 8080:9090": "1"})),
            with("env", json!({"A": 1})),
            with("runtype", json!("shell")),
            with("args", json!("-c echo")),
            with("onstart", json!("x".repeat(4049))),
            with("image_login", json!("-u user  -p token ghcr.io")),
            with("client_id", json!("you")),
            with("cancel_unavail", json!("true")),
            with("price", json!(500)),
            with("colour", json!("red")),
            json!({"disk": 10}),
        ] {
            assert!(parse_create(&bad).is_err(), "{bad} should be refused");
        }
        let mut no_cancel = valid();
        no_cancel.as_object_mut().unwrap().remove("cancel_unavail");
        assert!(!parse_create(&no_cancel).unwrap().cancel_unavail);
    }

    #[test]
    fn rows_price_the_allocated_storage() {
        let offer = crate::scenario::Scenario::default().offers[0].clone();
        let row = row(&offer, 72.0, false);
        assert!((row["dph_total"].as_f64().unwrap() - (offer.dph_base + 0.015)).abs() < 1e-9);
        assert_eq!(row["gpu_total_ram"], json!(offer.gpu_ram));
        assert!(
            row.get("verified").is_none(),
            "a virtual column, never a row key"
        );
    }
}
