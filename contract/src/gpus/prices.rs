//! The per-GPU-type prices a virtual node publishes for `runpod.io/provider: cheapest`: per
//! canonical GPU, GPU count and (RunPod) cloud class, the lowest USD per GPU-hour inside the
//! installation's policy. One node annotation, bounded in size, read by the webhook.
//!
//! The value is comma-separated entries `GPU x COUNTS [: CLASS] = USD per GPU-hour`, e.g.
//! `H100x1-8:SECURE=2.99,RTX4090x2=0.35,storage=0.0002`: `COUNTS` is one count or a range with
//! one price (RunPod prices per GPU whatever the count); Vast.ai entries have no class, and its
//! `storage` entry is the lowest disk price in USD per GB-hour, so that a pod's own disk is
//! priced in. `at=` says when (Unix seconds): prices a node stopped refreshing go stale.

use std::collections::BTreeMap;

use super::{GpuModel, by_name, resolve};

/// Node annotation with the per-type prices.
pub const GPU_PRICES: &str = "runpod.io/gpu-prices";
/// The entry holding the disk price (USD per GB-hour).
pub const STORAGE_KEY: &str = "storage";
/// The entry holding when the prices were published (Unix seconds, to five minutes).
pub const PUBLISHED_AT_KEY: &str = "at";
/// Prices older than this are not compared: their node's controller has stopped publishing.
pub const STALE_AFTER_SECS: i64 = 15 * 60;
/// How finely the publication time is written (a finer one would rewrite the node each time).
const PUBLISHED_AT_STEP: i64 = 300;
/// At most this many entries are published (every catalogue GPU in two classes and eight counts
/// fits): an annotation has to stay small.
const MAX_QUOTES: usize = 800;
/// GPU counts above this are not published (no pod asks for more on one machine).
const MAX_COUNT: u32 = 16;

/// What a price is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PriceKey {
    /// The canonical GPU name.
    pub gpu: String,
    /// RunPod's cloud class (`SECURE`, `COMMUNITY`); `None` on Vast.ai.
    pub class: Option<String>,
}

/// One published price: the lowest per GPU-hour for the counts `from..=to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Quote {
    pub key: PriceKey,
    pub from: u32,
    pub to: u32,
    pub per_gpu: f64,
}

/// Every price a node publishes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuPrices {
    pub quotes: Vec<Quote>,
    /// USD per GB-hour of disk (Vast.ai prices disk separately).
    pub storage_per_gb_hour: Option<f64>,
    /// When the node published them (Unix seconds); `None` from a node that does not say.
    pub published_at: Option<i64>,
}

/// The lowest price of a GPU type that fits a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub gpu: &'static str,
    /// USD per hour for the whole pod, its disk included.
    pub per_hour: f64,
}

/// What a pod needs, for [`GpuPrices::cheapest_fit`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Need {
    /// Wanted GPU names in any spelling; empty = any type.
    pub gpu_types: Vec<String>,
    pub min_memory_gb: Option<u32>,
    pub gpu_count: u32,
    /// RunPod's cloud class the pod runs in; `None` for Vast.ai.
    pub class: Option<String>,
    /// Disk priced in where the cloud prices disk (Vast.ai).
    pub disk_gb: u32,
}

/// The cheapest fit for a pod on one cloud: the lowest price of any fitting type, and the
/// lowest under the pod's cap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fits {
    pub cheapest: Option<Fit>,
    pub within_cap: Option<Fit>,
}

impl GpuPrices {
    /// Prices from `(canonical GPU, count, class, USD per GPU-hour)` observations: the lowest
    /// per key, equal prices of consecutive counts joined into one range. Unknown GPU names,
    /// counts of 0 or above 16 and prices that are not positive are dropped.
    pub fn from_observations<'a>(
        observations: impl IntoIterator<Item = (&'a str, u32, Option<&'a str>, f64)>,
        storage_per_gb_hour: Option<f64>,
    ) -> GpuPrices {
        let mut lowest: BTreeMap<(PriceKey, u32), f64> = BTreeMap::new();
        for (gpu, count, class, price) in observations {
            let Some(model) = by_name(gpu) else { continue };
            if count == 0 || count > MAX_COUNT || !(price.is_finite() && price > 0.0) {
                continue;
            }
            let key = PriceKey {
                gpu: model.name.to_owned(),
                class: class.map(str::to_owned),
            };
            lowest
                .entry((key, count))
                .and_modify(|p| *p = p.min(price))
                .or_insert(price);
        }
        let mut quotes: Vec<Quote> = Vec::new();
        // Prices are published to six decimals: one that rounds to nothing is not published.
        lowest.retain(|_, price| round(*price) > 0.0);
        for ((key, count), price) in lowest {
            match quotes.last_mut() {
                Some(last) if last.key == key && last.to + 1 == count && last.per_gpu == price => {
                    last.to = count;
                }
                _ => quotes.push(Quote {
                    key,
                    from: count,
                    to: count,
                    per_gpu: price,
                }),
            }
        }
        quotes.truncate(MAX_QUOTES);
        GpuPrices {
            quotes,
            storage_per_gb_hour: storage_per_gb_hour.filter(|p| p.is_finite() && *p >= 0.0),
            published_at: None,
        }
    }

    /// Stamps the prices as published at `now` (Unix seconds), to five minutes.
    pub fn stamped(mut self, now: i64) -> GpuPrices {
        self.published_at = Some(now - now.rem_euclid(PUBLISHED_AT_STEP));
        self
    }

    /// Whether they may be compared at `now`: published within [`STALE_AFTER_SECS`] (or by a
    /// node that does not say when).
    pub fn fresh(&self, now: i64) -> bool {
        self.published_at
            .is_none_or(|at| now - at <= STALE_AFTER_SECS + PUBLISHED_AT_STEP)
    }

    /// Adds another node's prices (of the same cloud): the lowest of each stays the lowest.
    /// Rebuilt through [`GpuPrices::from_observations`], so overlapping sheets (search tiers,
    /// nodes) stay one bounded sheet; the older publication time is kept.
    pub fn merge(&mut self, other: GpuPrices) {
        let storage = match (self.storage_per_gb_hour, other.storage_per_gb_hour) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let published_at = match (self.published_at, other.published_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let quotes = std::mem::take(&mut self.quotes);
        let observations: Vec<(&str, u32, Option<&str>, f64)> = quotes
            .iter()
            .chain(&other.quotes)
            .flat_map(|q| {
                (q.from..=q.to).map(move |count| {
                    (q.key.gpu.as_str(), count, q.key.class.as_deref(), q.per_gpu)
                })
            })
            .collect();
        *self = GpuPrices::from_observations(observations, storage);
        self.published_at = published_at;
    }

    pub fn is_empty(&self) -> bool {
        self.quotes.is_empty()
    }

    /// The annotation value.
    pub fn format(&self) -> String {
        let entries: Vec<String> = self
            .quotes
            .iter()
            .map(|q| {
                let counts = if q.from == q.to {
                    q.from.to_string()
                } else {
                    format!("{}-{}", q.from, q.to)
                };
                let class = q
                    .key
                    .class
                    .as_deref()
                    .map(|c| format!(":{c}"))
                    .unwrap_or_default();
                format!("{}x{counts}{class}={}", q.key.gpu, round(q.per_gpu))
            })
            .collect();
        // First, so that a reader's bound never cuts them off.
        let mut head = Vec::new();
        if let Some(at) = self.published_at {
            head.push(format!("{PUBLISHED_AT_KEY}={at}"));
        }
        if let Some(storage) = self.storage_per_gb_hour {
            head.push(format!("{STORAGE_KEY}={}", round(storage)));
        }
        head.extend(entries);
        head.join(",")
    }

    /// Reads the annotation; malformed entries and unknown GPUs are skipped (a node of a newer
    /// release may know more), and no more than the bound is read.
    pub fn parse(value: &str) -> GpuPrices {
        let mut prices = GpuPrices::default();
        for entry in value.split(',').take(MAX_QUOTES + 2) {
            let Some((key, price)) = entry.split_once('=') else {
                continue;
            };
            if key.trim() == PUBLISHED_AT_KEY {
                prices.published_at = price.trim().parse().ok();
                continue;
            }
            let Ok(price) = price.trim().parse::<f64>() else {
                continue;
            };
            if !price.is_finite() || price < 0.0 {
                continue;
            }
            if key.trim() == STORAGE_KEY {
                prices.storage_per_gb_hour = Some(price);
                continue;
            }
            // A GPU for nothing would win every comparison: never a price.
            if price <= 0.0 {
                continue;
            }
            if let Some(quote) = parse_key(key.trim(), price) {
                prices.quotes.push(quote);
            }
        }
        prices
    }

    /// The lowest price per GPU-hour per class (`SECURE=…`, or `no_class` for a cloud without
    /// classes), any type and count: what `runpod.io/cheapest-gpu-price` publishes.
    pub fn lowest_per_class(&self, no_class: &str) -> Vec<(String, f64)> {
        self.lowest_by(|quote| {
            quote
                .key
                .class
                .clone()
                .unwrap_or_else(|| no_class.to_owned())
        })
        .into_iter()
        .collect()
    }

    /// The lowest published price per GPU-hour of each catalogue GPU, any class and count (for
    /// `runpod-kubelet gpus`).
    pub fn lowest_per_gpu(&self) -> BTreeMap<String, f64> {
        self.lowest_by(|quote| quote.key.gpu.clone())
    }

    /// The lowest price per GPU-hour of the quotes sharing each key.
    fn lowest_by(&self, key: impl Fn(&Quote) -> String) -> BTreeMap<String, f64> {
        let mut lowest: BTreeMap<String, f64> = BTreeMap::new();
        for quote in &self.quotes {
            lowest
                .entry(key(quote))
                .and_modify(|p| *p = p.min(quote.per_gpu))
                .or_insert(quote.per_gpu);
        }
        lowest
    }

    /// The cheapest GPU type fitting `need` (types, memory, count, class), with the disk priced
    /// in, and the cheapest of those at or under `cap` (USD per hour for the whole pod).
    pub fn cheapest_fit(&self, need: &Need, cap: Option<f64>) -> Fits {
        let wanted: Option<Vec<&'static GpuModel>> = (!need.gpu_types.is_empty())
            .then(|| need.gpu_types.iter().flat_map(|n| resolve(n)).collect());
        let count = need.gpu_count.max(1);
        let storage = self.storage_per_gb_hour.unwrap_or(0.0) * f64::from(need.disk_gb);
        let mut fits = Fits::default();
        for quote in &self.quotes {
            let Some(model) = by_name(&quote.key.gpu) else {
                continue;
            };
            let fits_pod = (quote.from..=quote.to).contains(&count)
                && quote.key.class == need.class
                && need.min_memory_gb.is_none_or(|min| model.memory_gb >= min)
                && wanted
                    .as_ref()
                    .is_none_or(|w| w.iter().any(|m| m.name == model.name));
            if !fits_pod {
                continue;
            }
            let fit = Fit {
                gpu: model.name,
                per_hour: quote.per_gpu * f64::from(count) + storage,
            };
            let lower = |current: &Option<Fit>| {
                current
                    .as_ref()
                    .is_none_or(|best| fit.per_hour < best.per_hour)
            };
            if cap.is_none_or(|cap| fit.per_hour <= cap + 1e-9) && lower(&fits.within_cap) {
                fits.within_cap = Some(fit.clone());
            }
            if lower(&fits.cheapest) {
                fits.cheapest = Some(fit);
            }
        }
        fits
    }
}

/// `H100x1-8:SECURE`, `RTX4090x2`.
fn parse_key(key: &str, per_gpu: f64) -> Option<Quote> {
    let (head, class) = match key.split_once(':') {
        Some((head, class)) => (head, Some(class.trim().to_ascii_uppercase())),
        None => (key, None),
    };
    let (gpu, counts) = head.rsplit_once('x')?;
    let model = by_name(gpu)?;
    let (from, to) = match counts.split_once('-') {
        Some((from, to)) => (from.parse().ok()?, to.parse().ok()?),
        None => {
            let count = counts.parse().ok()?;
            (count, count)
        }
    };
    if from == 0 || from > to || to > MAX_COUNT || class.as_deref() == Some("") {
        return None;
    }
    Some(Quote {
        key: PriceKey {
            gpu: model.name.to_owned(),
            class,
        },
        from,
        to,
        per_gpu,
    })
}

/// Six decimals: the annotation stays short and a price keeps its cents.
fn round(price: f64) -> f64 {
    (price * 1e6).round() / 1e6
}
