//! RFC 3339 timestamps as the v2 API writes them, with microsecond precision so a timestamp
//! read back from a response (a log event's `ts`, a `since` cursor) names the same instant.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

/// Drops sub-microsecond digits, so formatting and parsing round-trip exactly.
pub(crate) fn truncate_micros(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH + Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(0)),
        Err(_) => UNIX_EPOCH,
    }
}

/// `2026-08-21T10:00:00.123456Z`: always six fractional digits, always UTC.
pub(crate) fn format(t: SystemTime) -> String {
    let format =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");
    OffsetDateTime::from(t)
        .format(&format)
        .unwrap_or_else(|_| "1970-01-01T00:00:00.000000Z".to_owned())
}

/// Any RFC 3339 timestamp (any offset, any precision).
pub(crate) fn parse(s: &str) -> Option<SystemTime> {
    OffsetDateTime::parse(s.trim(), &Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// Serde helpers writing `SystemTime` as RFC 3339 (the ledger's JSON form).
pub(crate) mod serde_time {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(crate) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*t))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        super::parse(&text).ok_or_else(|| D::Error::custom(format!("not RFC 3339: {text:?}")))
    }

    /// The same for `Option<SystemTime>` (`null` when absent).
    pub(crate) mod option {
        use std::time::SystemTime;

        use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

        pub(crate) fn serialize<S: Serializer>(
            t: &Option<SystemTime>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_str(&super::super::format(*t)),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<SystemTime>, D::Error> {
            match Option::<String>::deserialize(d)? {
                None => Ok(None),
                Some(text) => super::super::parse(&text)
                    .map(Some)
                    .ok_or_else(|| D::Error::custom(format!("not RFC 3339: {text:?}"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_at_microsecond_precision() {
        let t = truncate_micros(SystemTime::now());
        let text = format(t);
        assert!(text.ends_with('Z') && text.contains('.'), "{text}");
        assert_eq!(parse(&text), Some(t));
    }
}
