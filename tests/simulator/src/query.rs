//! Query-string parameters as the v2 API reads them: comma-separated lists (`style: form`,
//! `explode: false`, repeated parameters are joined), and 422 messages for malformed values.

use axum::extract::Query as AxumQuery;
use axum::http::Uri;

use crate::reply::Reply;

/// The decoded `name=value` pairs of a request.
#[derive(Debug, Default)]
pub(crate) struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Decodes the query string; an undecodable one is a 400.
    pub fn parse(uri: &Uri) -> Result<Query, Reply> {
        AxumQuery::<Vec<(String, String)>>::try_from_uri(uri)
            .map(|AxumQuery(pairs)| Query { pairs })
            .map_err(|e| Reply::problem(400, format!("malformed query string: {e}")))
    }

    pub fn has(&self, name: &str) -> bool {
        self.pairs.iter().any(|(n, _)| n == name)
    }

    /// The last value of a scalar parameter.
    pub fn single(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// All comma-separated items of a list parameter (trimmed, empty items dropped).
    pub fn list(&self, name: &str) -> Option<Vec<String>> {
        if !self.has(name) {
            return None;
        }
        Some(
            self.pairs
                .iter()
                .filter(|(n, _)| n == name)
                .flat_map(|(_, v)| v.split(','))
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// A list whose items must be one of `allowed`; bad items are reported in `errors`.
    pub fn enum_list(
        &self,
        name: &str,
        allowed: &[&str],
        errors: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        let items = self.list(name)?;
        for item in &items {
            if !allowed.contains(&item.as_str()) {
                errors.push(format!(
                    "query.{name}: {item:?} is not one of {}",
                    allowed.join(", ")
                ));
            }
        }
        Some(items)
    }

    /// A boolean (`true`/`false`).
    pub fn boolean(&self, name: &str, errors: &mut Vec<String>) -> Option<bool> {
        match self.single(name)? {
            "true" => Some(true),
            "false" => Some(false),
            other => {
                errors.push(format!("query.{name}: {other:?} is not a boolean"));
                None
            }
        }
    }

    /// An integer within `min..=max`.
    pub fn integer(&self, name: &str, min: u64, max: u64, errors: &mut Vec<String>) -> Option<u64> {
        let text = self.single(name)?;
        match text.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                errors.push(format!(
                    "query.{name}: {text:?} is not an integer between {min} and {max}"
                ));
                None
            }
        }
    }
}
