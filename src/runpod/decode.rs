//! Tolerant decoding for fields where RunPod's responses drift from the spec (api-notes P13):
//! prices arrive as numbers or strings, and nullable fields arrive as `null` or not at all.

use serde::{Deserialize, Deserializer};

/// A number that may be sent as a JSON number or a numeric string; `null`, absent and
/// unparsable values read as `None` rather than failing the whole response.
pub(crate) fn lenient_f64<'de, D>(deserializer: D) -> Result<Option<f64>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumberOrText {
        Number(f64),
        Text(String),
        Other(serde::de::IgnoredAny),
    }
    Ok(match Option::<NumberOrText>::deserialize(deserializer)? {
        Some(NumberOrText::Number(value)) => Some(value),
        Some(NumberOrText::Text(text)) => text.trim().parse::<f64>().ok(),
        Some(NumberOrText::Other(_)) | None => None,
    }
    .filter(|value| value.is_finite()))
}

/// An integer that may be sent as a number (possibly with a fraction) or a numeric string.
pub(crate) fn lenient_u32<'de, D>(deserializer: D) -> Result<Option<u32>, D::Error>
where
    D: Deserializer<'de>,
{
    Ok(lenient_f64(deserializer)?
        .filter(|value| *value >= 0.0 && *value <= f64::from(u32::MAX))
        .map(|value| value as u32))
}

/// `null` reads as the type's default, so a nullable list or map never fails decoding.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A value whose shape may drift: anything that does not decode as `T` (a wrong type, `null`)
/// reads as `T::default()` instead of failing the whole response. For telemetry, where a
/// malformed report must cost that report only.
pub(crate) fn or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Priced {
        #[serde(default, deserialize_with = "lenient_f64")]
        price: Option<f64>,
        #[serde(default, deserialize_with = "lenient_u32")]
        count: Option<u32>,
        #[serde(default, deserialize_with = "null_as_default")]
        list: Vec<String>,
    }

    fn read(json: &str) -> Priced {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn prices_read_from_numbers_strings_null_and_absence() {
        assert_eq!(read(r#"{"price":0.44}"#).price, Some(0.44));
        assert_eq!(read(r#"{"price":"0.74"}"#).price, Some(0.74));
        assert_eq!(read(r#"{"price":" 1 "}"#).price, Some(1.0));
        assert_eq!(read(r#"{"price":null}"#).price, None);
        assert_eq!(read(r#"{"price":"n/a"}"#).price, None);
        assert_eq!(read(r#"{"price":{"secure":1}}"#).price, None);
        assert_eq!(read("{}").price, None);
    }

    #[test]
    fn counts_and_nullable_lists() {
        assert_eq!(read(r#"{"count":"2"}"#).count, Some(2));
        assert_eq!(read(r#"{"count":-1}"#).count, None);
        assert!(read(r#"{"list":null}"#).list.is_empty());
        assert_eq!(read(r#"{"list":["a"]}"#).list, vec!["a".to_owned()]);
    }
}
