//! Which GPU cloud a burst pod goes to: `runpod.io/provider` on the pod or its owning Job, or as
//! a namespace label; `runpod` (the default), `vastai`, or `cheapest` (the webhook picks the
//! cloud whose published price is lower). Each cloud's virtual node carries its name as the
//! provider label and taint value, so the toleration and node selector name the cloud.

use std::fmt;

/// Pod or Job annotation, and namespace label, choosing the cloud.
pub const PROVIDER: &str = "runpod.io/provider";

/// A cloud the controller can run pods on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cloud {
    #[default]
    RunPod,
    VastAi,
}

impl Cloud {
    pub const ALL: [Cloud; 2] = [Cloud::RunPod, Cloud::VastAi];

    /// The provider label and taint value of its nodes, and the annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::RunPod => "runpod",
            Cloud::VastAi => "vastai",
        }
    }

    /// For messages.
    pub fn display_name(self) -> &'static str {
        match self {
            Cloud::RunPod => "RunPod",
            Cloud::VastAi => "Vast.ai",
        }
    }

    /// Case-insensitive, surrounding blanks ignored.
    pub fn parse(value: &str) -> Option<Cloud> {
        let value = value.trim();
        Cloud::ALL
            .into_iter()
            .find(|cloud| cloud.as_str().eq_ignore_ascii_case(value))
    }
}

impl fmt::Display for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a pod or namespace asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderChoice {
    Cloud(Cloud),
    /// The cloud with the lower published price for the pod.
    Cheapest,
}

impl ProviderChoice {
    pub const CHEAPEST: &'static str = "cheapest";

    /// Case-insensitive; `Err` names the accepted values.
    pub fn parse(value: &str) -> Result<ProviderChoice, String> {
        if value.trim().eq_ignore_ascii_case(Self::CHEAPEST) {
            return Ok(ProviderChoice::Cheapest);
        }
        Cloud::parse(value)
            .map(ProviderChoice::Cloud)
            .ok_or_else(|| {
                format!(
                    "{value:?} is not one of {}, {}, {}",
                    Cloud::RunPod,
                    Cloud::VastAi,
                    Self::CHEAPEST
                )
            })
    }
}

/// Pod annotation the webhook writes when `cheapest` chose: the choice and each cloud's price,
/// which the controller repeats in an Event when it creates the instance.
pub const CHEAPEST_CHOICE: &str = "runpod.io/cheapest-choice";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!(
            ProviderChoice::parse(" VastAI "),
            Ok(ProviderChoice::Cloud(Cloud::VastAi))
        );
        assert_eq!(
            ProviderChoice::parse("cheapest"),
            Ok(ProviderChoice::Cheapest)
        );
        let error = ProviderChoice::parse("aws").unwrap_err();
        assert!(error.contains("runpod, vastai, cheapest"), "{error}");
    }
}
