//! The `RateLimit` / `RateLimit-Policy` headers: RFC 9651 structured-field lists such as
//! `"minute";r=12;t=30, "hour";r=2800;t=1812`.

use reqwest::header::HeaderMap;

/// One member of a `RateLimit`/`RateLimit-Policy` list: `"minute";r=12;t=30`.
#[derive(Debug, PartialEq)]
pub(super) struct Member {
    pub name: String,
    params: Vec<(String, u64)>,
}

impl Member {
    pub(super) fn get(&self, key: &str) -> Option<u64> {
        self.params
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| *value)
    }
}

/// Parses a structured-field list header; a malformed header is ignored, not fatal.
pub(super) fn header_list(headers: &HeaderMap, name: &str) -> Option<Vec<Member>> {
    // A list may be split over several header lines; they join with commas.
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let value = lines.join(", ");
    let list: sfv::List = sfv::Parser::new(&value).parse().ok()?;
    Some(
        list.into_iter()
            .filter_map(|entry| match entry {
                sfv::ListEntry::Item(item) => {
                    let name = match &item.bare_item {
                        sfv::BareItem::String(text) => text.as_str().to_owned(),
                        sfv::BareItem::Token(token) => token.as_str().to_owned(),
                        _ => return None,
                    };
                    let params = item
                        .params
                        .iter()
                        .filter_map(|(key, value)| {
                            let value = i64::from(value.as_integer()?);
                            Some((key.as_str().to_owned(), u64::try_from(value).ok()?))
                        })
                        .collect();
                    Some(Member { name, params })
                }
                sfv::ListEntry::InnerList(_) => None,
            })
            .collect(),
    )
}
