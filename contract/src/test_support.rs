//! Helpers the crate's unit tests share.

use std::collections::BTreeMap;

/// A string map (annotations, labels) from literal pairs.
pub(crate) fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
