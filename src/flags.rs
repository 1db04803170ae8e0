//! The one set of flag parsers every subcommand and the clouds' own flag groups use, so a
//! duration or a price reads the same way on every flag.

use std::time::Duration;

/// `30` (bare seconds, as the Go kubelet took them) or a humantime duration such as `10s`.
pub fn seconds_or_duration(value: &str) -> Result<Duration, String> {
    if let Ok(seconds) = value.trim().parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(value.trim()).map_err(|e| format!("{value:?}: {e}"))
}

/// A duration above zero (a zero period would mean "never" or a busy loop).
pub fn positive_duration(value: &str) -> Result<Duration, String> {
    let duration = seconds_or_duration(value)?;
    if duration.is_zero() {
        return Err(format!("{value:?} must be longer than zero"));
    }
    Ok(duration)
}

/// A price in USD above zero.
pub fn positive_price(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|price| price.is_finite() && *price > 0.0)
        .ok_or_else(|| format!("{value:?} is not a positive number"))
}

/// A RunPod cloud tier, `SECURE` or `COMMUNITY` (any case).
pub fn cloud_type(value: &str) -> Result<runpod_contract::CloudType, String> {
    runpod_contract::CloudType::parse_named(value)
}

/// A share in percent, `0`..=`100`, with or without the `%` sign.
pub fn percent(value: &str) -> Result<f64, String> {
    let number: f64 = value
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if !(0.0..=100.0).contains(&number) {
        return Err(format!("{value:?} is not between 0 and 100"));
    }
    Ok(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_bare_seconds_and_humantime_and_refuse_zero() {
        assert_eq!(seconds_or_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(seconds_or_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(seconds_or_duration("0"), Ok(Duration::ZERO));
        assert!(seconds_or_duration("soon").is_err());
        assert_eq!(
            positive_duration("90d"),
            Ok(Duration::from_secs(90 * 86_400))
        );
        assert_eq!(positive_duration("10"), Ok(Duration::from_secs(10)));
        for zero in ["0", "0s", "0d"] {
            let error = positive_duration(zero).unwrap_err();
            assert!(error.contains("longer than zero"), "{zero}: {error}");
        }
    }

    #[test]
    fn prices_and_percentages_are_bounded() {
        assert_eq!(positive_price("0.5"), Ok(0.5));
        for bad in ["0", "-1", "NaN", "inf", "cheap"] {
            assert!(positive_price(bad).is_err(), "{bad}");
        }
        assert_eq!(percent("5%"), Ok(5.0));
        assert_eq!(percent("100"), Ok(100.0));
        assert!(percent("101").is_err());
        assert!(percent("x").is_err());
    }
}

/// `--expose-ports`: what a pod that names no `runpod.io/ports` exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExposePorts {
    /// Its declared `containerPort`s (HTTP or TCP detected), as public endpoints of the cloud.
    Auto,
    /// None: a pod exposes only what `runpod.io/ports` lists.
    None,
}
