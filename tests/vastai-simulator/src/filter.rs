//! The offer search grammar of `POST /api/v0/bundles/`: a flat JSON object of
//! `"field": {"op": value}` filters (ops `eq neq gt gte lt lte in notin`) plus `type`,
//! `order`, `limit` and `allocated_storage`. Parsed strictly (unknown fields, ops and value
//! types are refused) and evaluated on search rows, including the virtual columns
//! `verified`, `datacenter` and `external`, and `geolocation` compared by its country code.

use std::cmp::Ordering;

use serde_json::{Map, Value};

/// Columns a filter or an order may name.
const FIELDS: [&str; 28] = [
    "id",
    "cpu_ram",
    "cpu_cores_effective",
    "machine_id",
    "host_id",
    "gpu_name",
    "num_gpus",
    "gpu_ram",
    "gpu_total_ram",
    "dph_base",
    "dph_total",
    "storage_cost",
    "reliability",
    "reliability2",
    "geolocation",
    "verified",
    "datacenter",
    "external",
    "rentable",
    "rented",
    "inet_up",
    "inet_down",
    "disk_space",
    "cuda_max_good",
    "direct_port_count",
    "duration",
    "hosting_type",
    "score",
];

const OPS: [&str; 8] = ["eq", "neq", "gt", "gte", "lt", "lte", "in", "notin"];

/// One `field op value` condition.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filter {
    pub field: String,
    pub op: String,
    pub value: Value,
}

/// A parsed search body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Search {
    pub filters: Vec<Filter>,
    /// `(field, descending)`, first key first.
    pub order: Vec<(String, bool)>,
    pub limit: Option<usize>,
    /// GB of disk priced into each row's `dph_total`.
    pub allocated_storage: f64,
    /// `bid` prices rows at their minimum bid.
    pub bid: bool,
}

/// Parses a search body; `Err` is the message of a 400 `invalid_request`.
pub(crate) fn parse(body: &Value) -> Result<Search, String> {
    let object = body
        .as_object()
        .ok_or("the search body must be a JSON object")?;
    let mut search = Search {
        filters: Vec::new(),
        order: Vec::new(),
        limit: None,
        allocated_storage: 8.0,
        bid: false,
    };
    for (key, value) in object {
        match key.as_str() {
            "type" => {
                search.bid = match value.as_str() {
                    Some("on-demand" | "ondemand" | "reserved") => false,
                    Some("bid") => true,
                    _ => return Err(format!("type {value} is not on-demand, bid or reserved")),
                }
            }
            "limit" => {
                let limit = value
                    .as_u64()
                    .filter(|limit| *limit > 0)
                    .ok_or_else(|| format!("limit {value} is not a positive integer"))?;
                search.limit = Some(usize::try_from(limit).unwrap_or(usize::MAX));
            }
            "allocated_storage" => {
                search.allocated_storage = value
                    .as_f64()
                    .filter(|gb| gb.is_finite() && *gb >= 0.0)
                    .ok_or_else(|| format!("allocated_storage {value} is not a number of GB"))?;
            }
            "order" => search.order = parse_order(value)?,
            field if FIELDS.contains(&field) => {
                let mut one = Map::new();
                one.insert(field.to_owned(), value.clone());
                search
                    .filters
                    .append(&mut parse_instance_filter(&Value::Object(one))?);
            }
            unknown => return Err(format!("unknown search field {unknown:?}")),
        }
    }
    Ok(search)
}

/// Filters of the form `{"column": {"op": value}}`: a search field's, or `select_filters` of the v1 instance list: `{"column": {"op": value}}`, columns checked by
/// the caller.
pub(crate) fn parse_instance_filter(value: &Value) -> Result<Vec<Filter>, String> {
    let mut filters = Vec::new();
    for (field, ops) in value.as_object().into_iter().flatten() {
        let ops = ops
            .as_object()
            .ok_or_else(|| format!("filter {field} must be an object of operators"))?;
        for (op, operand) in ops {
            check_operand(field, op, operand)?;
            filters.push(Filter {
                field: field.clone(),
                op: op.clone(),
                value: operand.clone(),
            });
        }
    }
    Ok(filters)
}

fn parse_order(value: &Value) -> Result<Vec<(String, bool)>, String> {
    let bad = || format!("order {value} is not a list of [field, \"asc\"|\"desc\"]");
    value
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|entry| match entry.as_array().map(Vec::as_slice) {
            Some([Value::String(field), Value::String(dir)])
                if FIELDS.contains(&field.as_str()) && (dir == "asc" || dir == "desc") =>
            {
                Ok((field.clone(), dir == "desc"))
            }
            _ => Err(bad()),
        })
        .collect()
}

fn check_operand(field: &str, op: &str, operand: &Value) -> Result<(), String> {
    if !OPS.contains(&op) {
        return Err(format!(
            "filter {field}: unknown operator {op:?} (one of {})",
            OPS.join(" ")
        ));
    }
    let scalar =
        |value: &Value| matches!(value, Value::Bool(_) | Value::Number(_) | Value::String(_));
    let fine = match op {
        "in" | "notin" => operand
            .as_array()
            .is_some_and(|items| items.iter().all(scalar)),
        "gt" | "gte" | "lt" | "lte" => operand.is_number(),
        _ => scalar(operand),
    };
    if fine {
        Ok(())
    } else {
        Err(format!("filter {field}: {op} cannot take {operand}"))
    }
}

/// The country code at the end of a host's free-text geolocation (`Texas, US` → `US`,
/// `, US` → `US`, `US` → `US`); `None` when the text does not end in two letters.
pub fn country_code(geolocation: &str) -> Option<String> {
    let last = geolocation.rsplit(',').next()?.trim();
    (last.len() == 2 && last.chars().all(|c| c.is_ascii_alphabetic()))
        .then(|| last.to_ascii_uppercase())
}

/// The value a filter compares for `field`: virtual columns derived, geolocation as its code.
fn column(row: &Map<String, Value>, field: &str) -> Value {
    match field {
        "verified" => {
            Value::Bool(row.get("verification").and_then(Value::as_str) == Some("verified"))
        }
        "datacenter" => Value::Bool(row.get("hosting_type").and_then(Value::as_u64) == Some(1)),
        "external" => Value::Bool(false),
        "geolocation" => row
            .get("geolocation")
            .and_then(Value::as_str)
            .and_then(country_code)
            .map_or(Value::Null, Value::String),
        _ => row.get(field).cloned().unwrap_or(Value::Null),
    }
}

fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_f64()?.partial_cmp(&b.as_f64()?),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        _ => None,
    }
}

fn equal(a: &Value, b: &Value) -> bool {
    compare(a, b) == Some(Ordering::Equal)
}

impl Filter {
    /// Whether the row passes; a missing or mistyped column never does.
    pub fn accepts(&self, row: &Map<String, Value>) -> bool {
        let actual = column(row, &self.field);
        let items = || self.value.as_array().into_iter().flatten();
        match self.op.as_str() {
            "eq" => equal(&actual, &self.value),
            "neq" => !actual.is_null() && !equal(&actual, &self.value),
            "gt" => compare(&actual, &self.value) == Some(Ordering::Greater),
            "gte" => matches!(
                compare(&actual, &self.value),
                Some(Ordering::Greater | Ordering::Equal)
            ),
            "lt" => compare(&actual, &self.value) == Some(Ordering::Less),
            "lte" => matches!(
                compare(&actual, &self.value),
                Some(Ordering::Less | Ordering::Equal)
            ),
            "in" => items().any(|item| equal(&actual, item)),
            "notin" => !actual.is_null() && !items().any(|item| equal(&actual, item)),
            _ => false,
        }
    }
}

impl Search {
    /// Filters, orders and truncates rows.
    pub fn apply(&self, rows: Vec<Map<String, Value>>) -> Vec<Map<String, Value>> {
        let mut rows: Vec<_> = rows
            .into_iter()
            .filter(|row| self.filters.iter().all(|filter| filter.accepts(row)))
            .collect();
        rows.sort_by(|a, b| {
            for (field, descending) in &self.order {
                let ordering =
                    compare(&column(a, field), &column(b, field)).unwrap_or(Ordering::Equal);
                let ordering = if *descending {
                    ordering.reverse()
                } else {
                    ordering
                };
                if ordering != Ordering::Equal {
                    return ordering;
                }
            }
            Ordering::Equal
        });
        if let Some(limit) = self.limit {
            rows.truncate(limit);
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn country_codes_come_from_the_end_of_the_text() {
        assert_eq!(country_code("Texas, US").as_deref(), Some("US"));
        assert_eq!(country_code(", US").as_deref(), Some("US"));
        assert_eq!(country_code("US").as_deref(), Some("US"));
        assert_eq!(
            country_code("Yutakachō, Shinagawa District, Tokyo, JP").as_deref(),
            Some("JP")
        );
        assert_eq!(country_code("California, United States"), None);
        assert_eq!(country_code(""), None);
    }

    #[test]
    fn parses_the_grammar_and_refuses_the_rest() {
        let search = parse(&json!({
            "gpu_name": {"in": ["RTX 4090"]}, "gpu_ram": {"gte": 24000},
            "verified": {"eq": true}, "rented": {"eq": false},
            "type": "on-demand", "order": [["dph_total", "asc"]], "limit": 5,
            "allocated_storage": 50
        }))
        .unwrap();
        assert_eq!(search.filters.len(), 4);
        assert_eq!(search.order, vec![("dph_total".to_owned(), false)]);
        assert_eq!(search.limit, Some(5));
        assert_eq!(search.allocated_storage, 50.0);
        for bad in [
            json!([]),
            json!({"gpu_nam": {"eq": "RTX 4090"}}),
            json!({"gpu_name": "RTX 4090"}),
            json!({"gpu_name": {"like": "RTX"}}),
            json!({"gpu_ram": {"gte": "24"}}),
            json!({"gpu_name": {"in": "RTX 4090"}}),
            json!({"type": "spot"}),
            json!({"limit": 0}),
            json!({"order": [["price", "asc"]]}),
            json!({"allocated_storage": -1}),
        ] {
            assert!(parse(&bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn filters_read_virtual_columns_and_country_codes() {
        let rows = vec![
            row(
                json!({"id": 1, "verification": "verified", "hosting_type": 1, "geolocation": "Texas, US", "dph_total": 0.5}),
            ),
            row(
                json!({"id": 2, "verification": "unverified", "hosting_type": 0, "geolocation": "Poland, PL", "dph_total": 0.3}),
            ),
            row(
                json!({"id": 3, "verification": "verified", "hosting_type": 0, "geolocation": "California, United States", "dph_total": 0.1}),
            ),
        ];
        let ids = |body: Value| -> Vec<u64> {
            parse(&body)
                .unwrap()
                .apply(rows.clone())
                .iter()
                .filter_map(|r| r["id"].as_u64())
                .collect()
        };
        assert_eq!(ids(json!({"verified": {"eq": true}})), vec![1, 3]);
        assert_eq!(ids(json!({"datacenter": {"eq": true}})), vec![1]);
        assert_eq!(
            ids(json!({"geolocation": {"in": ["US", "PL"]}})),
            vec![1, 2]
        );
        // An unparsable location matches neither `in` nor `notin`.
        assert_eq!(ids(json!({"geolocation": {"notin": ["PL"]}})), vec![1]);
        assert_eq!(
            ids(json!({"dph_total": {"lte": 0.3}, "order": [["dph_total", "asc"]]})),
            vec![3, 2]
        );
        assert_eq!(
            ids(json!({"order": [["dph_total", "desc"]], "limit": 1})),
            vec![1]
        );
    }
}
