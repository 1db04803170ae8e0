//! The GPU and data-centre catalogue (`/v2/catalog/...`), decoded tolerantly: the placement
//! decision reads only ids, memory, prices, ceilings and stock, and ignores everything else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::decode::{lenient_f64, lenient_u32, null_as_default};
use runpod_contract::CloudType;

/// Stock as the catalogue reports it; anything unrecognised reads as `Unknown`, which
/// placement treats like `Low` (stock never predicts success anyway, api-notes P2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Availability {
    None,
    Low,
    Medium,
    High,
    #[serde(other)]
    #[default]
    Unknown,
}

impl Availability {
    /// Higher is more stock; `Unknown` ranks with `Low`.
    pub fn rank(self) -> u8 {
        match self {
            Availability::None => 0,
            Availability::Low | Availability::Unknown => 1,
            Availability::Medium => 2,
            Availability::High => 3,
        }
    }
}

/// Per-cloud list price in USD per GPU per hour.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CloudPrices {
    #[serde(default, deserialize_with = "lenient_f64")]
    pub secure: Option<f64>,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub community: Option<f64>,
}

/// Per-cloud ceiling of GPUs in one pod (not current stock).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CloudCounts {
    #[serde(default, deserialize_with = "lenient_u32")]
    pub secure: Option<u32>,
    #[serde(default, deserialize_with = "lenient_u32")]
    pub community: Option<u32>,
}

/// Stock of one GPU type in one data centre.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataCenterStock {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub availability: Availability,
}

/// One entry of `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuType {
    /// The id to send in `gpu.id`, verbatim (api-notes P10).
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// VRAM in GB.
    #[serde(default, deserialize_with = "lenient_u32")]
    pub memory: Option<u32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub secure: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub community: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub price: CloudPrices,
    #[serde(default, deserialize_with = "null_as_default")]
    pub max_count: CloudCounts,
    #[serde(default)]
    pub availability: Option<Availability>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub data_centers: Vec<DataCenterStock>,
}

impl GpuType {
    /// Whether this type is offered on `cloud` at all.
    pub fn offered_on(&self, cloud: CloudType) -> bool {
        match cloud {
            CloudType::Secure => self.secure,
            CloudType::Community => self.community,
        }
    }

    /// List price per GPU-hour on `cloud`; `None` when not offered or unpriced.
    pub fn price_on(&self, cloud: CloudType) -> Option<f64> {
        let price = match cloud {
            CloudType::Secure => self.price.secure,
            CloudType::Community => self.price.community,
        };
        price.filter(|price| *price > 0.0)
    }

    /// Largest GPU count per pod on `cloud`; unknown ceilings do not exclude the type.
    pub fn max_count_on(&self, cloud: CloudType) -> Option<u32> {
        match cloud {
            CloudType::Secure => self.max_count.secure,
            CloudType::Community => self.max_count.community,
        }
    }
}

/// `{"gpus": [...]}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct GpuTypeList {
    #[serde(default, deserialize_with = "null_as_default")]
    pub gpus: Vec<GpuType>,
}

/// One entry of `GET /v2/catalog/datacenters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataCenter {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub compliance: Vec<String>,
}

/// `{"dataCenters": [...]}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DataCenterList {
    #[serde(default, deserialize_with = "null_as_default")]
    pub data_centers: Vec<DataCenter>,
}

/// The catalogue as one value, for the pure placement decision. Stock differs per cloud, so
/// the GPU list is read once per cloud (`cloud=SECURE` / `cloud=COMMUNITY`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalogue {
    /// `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=SECURE`.
    pub secure: Vec<GpuType>,
    /// The same with `cloud=COMMUNITY`.
    pub community: Vec<GpuType>,
    /// Data-centre id → its record (names, regions), when it was read.
    pub data_centers: BTreeMap<String, DataCenter>,
}

impl Catalogue {
    /// The GPU types as read for `cloud`, with that cloud's stock.
    pub fn gpus(&self, cloud: CloudType) -> &[GpuType] {
        match cloud {
            CloudType::Secure => &self.secure,
            CloudType::Community => &self.community,
        }
    }
}
