//! The OpenAPI contract as a checker: request bodies (the simulator's 422s) and recorded
//! exchanges (every response of a test run) are validated against the vendored
//! `openapi-v2.json`, so the simulator cannot drift from the real API's shapes unnoticed.
//!
//! OpenAPI 3.1 schemas are JSON Schema 2020-12: each validator is built from
//! `{"$schema": 2020-12, "$ref": "#/components/schemas/X", "components": <spec components>}`
//! so the spec's `#/components/...` references resolve. Compiled validators are cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use jsonschema::{ValidationError, Validator};
use serde_json::{Value, json};

use crate::exchange::Exchange;

const SPEC_TEXT: &str = include_str!("../openapi-v2.json");
const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// Why the spec could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("openapi-v2.json is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("openapi-v2.json has no `paths` or `components` object")]
    Shape,
}

/// Validates bodies and exchanges against the vendored RunPod v2 OpenAPI document.
pub struct SpecValidator {
    /// The parsed spec, or why it could not be loaded (then every check reports that).
    spec: Result<Value, String>,
    cache: Mutex<HashMap<String, Arc<Validator>>>,
}

impl std::fmt::Debug for SpecValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecValidator")
            .field("loaded", &self.spec.is_ok())
            .finish_non_exhaustive()
    }
}

impl SpecValidator {
    /// The vendored spec. Never panics: if the embedded file were broken, every validation
    /// would report that instead.
    pub fn load() -> SpecValidator {
        Self::try_load().unwrap_or_else(|error| SpecValidator {
            spec: Err(error.to_string()),
            cache: Mutex::default(),
        })
    }

    /// The vendored spec, or why it cannot be used.
    pub fn try_load() -> Result<SpecValidator, SpecError> {
        Self::from_json(SPEC_TEXT)
    }

    /// Any OpenAPI 3.1 document in the same layout.
    pub fn from_json(text: &str) -> Result<SpecValidator, SpecError> {
        let spec: Value = serde_json::from_str(text)?;
        if !spec.get("paths").is_some_and(Value::is_object)
            || !spec.get("components").is_some_and(Value::is_object)
        {
            return Err(SpecError::Shape);
        }
        Ok(SpecValidator {
            spec: Ok(spec),
            cache: Mutex::default(),
        })
    }

    /// One process-wide instance, so simulators share compiled validators.
    pub(crate) fn shared() -> &'static SpecValidator {
        static SHARED: OnceLock<SpecValidator> = OnceLock::new();
        SHARED.get_or_init(SpecValidator::load)
    }

    fn spec(&self) -> Result<&Value, Vec<String>> {
        self.spec.as_ref().map_err(|e| vec![e.clone()])
    }

    /// Validates a request body against `#/components/schemas/<schema>`, e.g.
    /// `"CreatePodRequest"`. Errors are one string per violation, `$.path: message`.
    pub fn validate_request(&self, schema: &str, body: &Value) -> Result<(), Vec<String>> {
        let reference = json!({ "$ref": format!("#/components/schemas/{schema}") });
        self.validate_against(&reference, body)
    }

    /// Validates `instance` against a schema from the spec (a `$ref` or an inline schema).
    fn validate_against(&self, schema: &Value, instance: &Value) -> Result<(), Vec<String>> {
        let validator = self.compiled(schema)?;
        let errors: Vec<ValidationError<'_>> = validator.iter_errors(instance).collect();
        if errors.is_empty() {
            return Ok(());
        }
        Err(describe(&errors))
    }

    fn compiled(&self, schema: &Value) -> Result<Arc<Validator>, Vec<String>> {
        let key = schema.to_string();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = cache.get(&key) {
            return Ok(found.clone());
        }
        let spec = self.spec()?;
        let mut root = json!({
            "$schema": DRAFT_2020_12,
            "components": spec.get("components").cloned().unwrap_or(Value::Null),
        });
        if let (Some(root), Some(reference)) = (root.as_object_mut(), schema.get("$ref")) {
            root.insert("$ref".to_owned(), reference.clone());
        } else if let Some(root) = root.as_object_mut() {
            root.insert("allOf".to_owned(), json!([schema]));
        }
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&root)
            .map_err(|e| vec![format!("the spec schema {key} does not compile: {e}")])?;
        let validator = Arc::new(validator);
        cache.insert(key, validator.clone());
        Ok(validator)
    }

    /// Checks one exchange against the spec operation for its method and path: the status is
    /// documented (or covered by `default`), the content type is the documented one, a JSON
    /// body matches its schema, a documented body-less response (204) has no body, and the
    /// rate-limit and `Retry-After` headers are well-formed. SSE responses are checked for
    /// their content type only.
    pub fn validate_exchange(&self, ex: &Exchange) -> Result<(), Vec<String>> {
        let spec = self.spec()?;
        let mut errors = Vec::new();
        let path = ex.path.split(['?', '#']).next().unwrap_or_default();
        let method = ex.method.to_ascii_lowercase();
        let operation = find_path(spec, path).and_then(|item| item.get(&method));
        let response = match operation {
            Some(operation) => {
                let id = operation.get("operationId").and_then(Value::as_str);
                if let Some(op) = ex.operation
                    && Some(op.operation_id()) != id
                {
                    errors.push(format!(
                        "recorded as {op} but the spec names this operation {}",
                        id.unwrap_or("(none)")
                    ));
                }
                let responses = operation.get("responses");
                let listed = responses.is_some_and(|r| r.get(ex.status.to_string()).is_some());
                if !listed && !ex.injected && !generally_possible(spec, ex.status, operation) {
                    errors.push(format!(
                        "status {} is neither listed for {} nor named in its description",
                        ex.status,
                        id.unwrap_or("this operation")
                    ));
                }
                let documented = responses.and_then(|r| {
                    r.get(ex.status.to_string())
                        .or_else(|| r.get(format!("{}XX", ex.status / 100)))
                        .or_else(|| r.get("default"))
                });
                match documented {
                    Some(response) => resolve(spec, response).clone(),
                    None => {
                        errors.push(format!(
                            "status {} is not documented for {} and there is no default",
                            ex.status,
                            id.unwrap_or("this operation")
                        ));
                        return Err(errors);
                    }
                }
            }
            // Unknown path or method: only an error (404, 405, 401, 429 …) in problem+json.
            None => {
                if ex.operation.is_some() {
                    errors.push("recorded with an operation, but the spec has none here".into());
                }
                if ex.status < 400 {
                    errors.push(format!(
                        "{} {path} is not in the spec but answered {}",
                        ex.method, ex.status
                    ));
                }
                if ex.status == 405 && ex.header("allow").is_none() {
                    errors.push("405 without an Allow header".into());
                }
                // A path no route serves gets the router's plain-text 404 (api-notes P8).
                let plain = ex
                    .content_type
                    .as_deref()
                    .is_some_and(|ct| ct.starts_with("text/plain"));
                if ex.status == 404 && plain {
                    return if errors.is_empty() {
                        Ok(())
                    } else {
                        Err(errors)
                    };
                }
                json!({"content": {"application/problem+json": {
                    "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
            }
        };
        self.check_response(ex, &response, &mut errors);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    fn check_response(&self, ex: &Exchange, response: &Value, errors: &mut Vec<String>) {
        let media_type = ex.content_type.as_deref().map(|ct| {
            ct.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        });
        match response
            .get("content")
            .and_then(Value::as_object)
            .filter(|c| !c.is_empty())
        {
            None => {
                if ex.body.is_some() || media_type.is_some() {
                    errors.push(format!(
                        "status {} is documented without a body, but the response has one ({})",
                        ex.status,
                        media_type.as_deref().unwrap_or("no content type")
                    ));
                }
            }
            Some(content) => {
                let Some(media_type) = media_type else {
                    errors.push("response has no Content-Type".into());
                    return;
                };
                let Some(entry) = content.get(&media_type) else {
                    let documented: Vec<&str> = content.keys().map(String::as_str).collect();
                    errors.push(format!(
                        "content type {media_type} is not documented (expected {})",
                        documented.join(" or ")
                    ));
                    return;
                };
                if media_type == "text/event-stream" {
                    return;
                }
                let Some(schema) = entry.get("schema") else {
                    return;
                };
                match &ex.body {
                    None => errors.push(format!("{media_type} response without a JSON body")),
                    Some(body) => {
                        if let Err(violations) = self.validate_against(schema, body) {
                            errors.extend(violations.into_iter().map(|v| format!("body {v}")));
                        }
                    }
                }
            }
        }
        let headers = response.get("headers").and_then(Value::as_object);
        let documented =
            |name: &str| headers.is_some_and(|h| h.keys().any(|k| k.eq_ignore_ascii_case(name)));
        if documented("Retry-After") || ex.status == 429 {
            match ex.header("retry-after") {
                Some(v) if v.parse::<u64>().is_ok() => {}
                Some(v) => errors.push(format!("Retry-After {v:?} is not whole seconds")),
                None if ex.status == 429 => errors.push("429 without Retry-After".into()),
                None => {}
            }
        }
        if let Some(v) = ex.header("ratelimit")
            && !structured_list(v, "r", "t")
        {
            errors.push(format!("RateLimit {v:?} is not a \"name\";r=N;t=N list"));
        }
        if let Some(v) = ex.header("ratelimit-policy")
            && !structured_list(v, "q", "w")
        {
            errors.push(format!(
                "RateLimit-Policy {v:?} is not a \"name\";q=N;w=N list"
            ));
        }
    }

    /// Every violation in `exchanges`, each prefixed with method, path and status.
    pub fn check_all(&self, exchanges: &[Exchange]) -> Vec<String> {
        exchanges
            .iter()
            .filter_map(|ex| {
                self.validate_exchange(ex).err().map(|errors| {
                    errors
                        .into_iter()
                        .map(|e| format!("{} {} -> {}: {e}", ex.method, ex.path, ex.status))
                        .collect::<Vec<_>>()
                })
            })
            .flatten()
            .collect()
    }
}

/// The path item whose template matches `path` (literal segments beat `{params}`).
/// Statuses any operation may answer although its `responses` do not list them (they fall
/// to `default`): auth, method and size refusals, request validation (422: the service
/// validates query parameters against their schemas too), rate limits and server errors, plus
/// those the operation's or its parameters' descriptions name (createPod's 402, "400
/// otherwise" on catalogue filters).
fn generally_possible(spec: &Value, status: u16, operation: &Value) -> bool {
    if matches!(status, 401 | 403 | 405 | 413 | 422 | 429) || (500..600).contains(&status) {
        return true;
    }
    let description = operation
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if description.contains(&format!("`{status}`")) {
        return true;
    }
    // Query parameters document their own refusals, e.g. "(400 otherwise)", "is a 422".
    let code = status.to_string();
    operation
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|parameter| resolve(spec, parameter).get("description")?.as_str())
        .any(|text| {
            text.split(|c: char| !c.is_ascii_digit())
                .any(|word| word == code)
        })
}

fn find_path<'a>(spec: &'a Value, path: &str) -> Option<&'a Value> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    spec.get("paths")?
        .as_object()?
        .iter()
        .filter_map(|(template, item)| {
            let parts: Vec<&str> = template.split('/').collect();
            if parts.len() != segments.len() {
                return None;
            }
            let mut literal = 0;
            for (part, segment) in parts.iter().zip(&segments) {
                if part.starts_with('{') && part.ends_with('}') {
                    if segment.is_empty() {
                        return None;
                    }
                } else if part == segment {
                    literal += 1;
                } else {
                    return None;
                }
            }
            Some((literal, item))
        })
        .max_by_key(|(literal, _)| *literal)
        .map(|(_, item)| item)
}

/// Follows a `$ref` to `#/components/...` (one level, as the spec uses them).
fn resolve<'a>(spec: &'a Value, value: &'a Value) -> &'a Value {
    value
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|pointer| spec.pointer(pointer))
        .unwrap_or(value)
}

/// `"minute";r=5;t=60, "hour";…`: every member a quoted name with the two integer params.
fn structured_list(value: &str, first: &str, second: &str) -> bool {
    value.split(',').all(|member| {
        let mut parts = member.trim().split(';');
        let name_ok = parts
            .next()
            .is_some_and(|n| n.len() > 2 && n.starts_with('"') && n.ends_with('"'));
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let int = |key: &str| {
            params
                .iter()
                .any(|(k, v)| *k == key && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        };
        name_ok && int(first) && int(second)
    })
}

/// `$.gpu.count`, `$.ports[0]`.
fn json_path<'a>(segments: impl Iterator<Item = LocationSegment<'a>>) -> String {
    let mut path = String::from("$");
    for segment in segments {
        match segment {
            LocationSegment::Property(name) => {
                path.push('.');
                path.push_str(&name);
            }
            LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
        }
    }
    path
}

/// One message per violation. Unknown properties are named one by one (`$.bogus: …`); an
/// "unknown property" report for a property that failed its own schema is dropped, because
/// 2020-12 forgets annotations of failed subschemas and would call it unknown too.
fn describe(errors: &[ValidationError<'_>]) -> Vec<String> {
    let failed_paths: Vec<String> = errors
        .iter()
        .filter(|e| !matches!(e.kind(), ValidationErrorKind::UnevaluatedProperties { .. }))
        .map(|e| json_path(e.instance_path().segments()))
        .collect();
    let mut out = Vec::new();
    for error in errors {
        let path = json_path(error.instance_path().segments());
        match error.kind() {
            ValidationErrorKind::UnevaluatedProperties { unexpected }
            | ValidationErrorKind::AdditionalProperties { unexpected } => {
                for name in unexpected {
                    let child = format!("{path}.{name}");
                    let failed_itself = failed_paths.iter().any(|p| {
                        p == &child
                            || p.starts_with(&format!("{child}."))
                            || p.starts_with(&format!("{child}["))
                    });
                    if !failed_itself {
                        out.push(format!("{child}: unknown field '{name}' is not allowed"));
                    }
                }
            }
            _ => out.push(format!("{path}: {error}")),
        }
    }
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_errors_name_the_offending_field() {
        let spec = SpecValidator::load();
        let errors = spec
            .validate_request(
                "CreatePodRequest",
                &json!({"name": "x", "image": "i", "gpu": {"id": "g", "count": 0}, "bogus": 1}),
            )
            .unwrap_err();
        assert!(
            errors.iter().any(|e| e.starts_with("$.bogus:")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.starts_with("$.gpu.count:")),
            "{errors:?}"
        );
        assert!(
            !errors.iter().any(|e| e.starts_with("$.gpu: unknown")),
            "{errors:?}"
        );
        spec.validate_request(
            "CreatePodRequest",
            &json!({"name": "x", "image": "i", "gpu": {"id": "g", "count": 1}}),
        )
        .unwrap();
    }

    #[test]
    fn structured_lists_parse() {
        assert!(structured_list(
            "\"minute\";r=0;t=12, \"hour\";r=2800;t=1812",
            "r",
            "t"
        ));
        assert!(!structured_list("minute;r=0;t=12", "r", "t"));
        assert!(!structured_list("\"minute\";r=-1;t=12", "r", "t"));
    }
}
