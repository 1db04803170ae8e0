//! The catalogue indexed by normalized name, built once: every admission review looks up each
//! of a pod's (or its Job's) GPU names, and a scan of the catalogue's 170-odd names for each
//! took a seventh of the webhook's time at 64 connections (perf, issue 47).

use std::collections::HashMap;
use std::sync::LazyLock;

use super::{CATALOGUE, GpuModel, normalize};
use crate::provider::Cloud;

/// Positions in [`CATALOGUE`], in catalogue order.
type Positions = Vec<usize>;

pub(super) struct Index {
    /// Canonical name → the first model with it.
    canonical: HashMap<String, usize>,
    runpod: HashMap<String, Positions>,
    vastai: HashMap<String, Positions>,
}

pub(super) static INDEX: LazyLock<Index> = LazyLock::new(|| {
    let mut index = Index {
        canonical: HashMap::new(),
        runpod: HashMap::new(),
        vastai: HashMap::new(),
    };
    for (position, model) in CATALOGUE.iter().enumerate() {
        index
            .canonical
            .entry(normalize(model.name))
            .or_insert(position);
        for cloud in [Cloud::RunPod, Cloud::VastAi] {
            for own in model.names_on(cloud) {
                let positions = index.on_mut(cloud).entry(normalize(own)).or_default();
                if !positions.contains(&position) {
                    positions.push(position);
                }
            }
        }
    }
    index
});

impl Index {
    fn on(&self, cloud: Cloud) -> &HashMap<String, Positions> {
        match cloud {
            Cloud::RunPod => &self.runpod,
            Cloud::VastAi => &self.vastai,
        }
    }

    fn on_mut(&mut self, cloud: Cloud) -> &mut HashMap<String, Positions> {
        match cloud {
            Cloud::RunPod => &mut self.runpod,
            Cloud::VastAi => &mut self.vastai,
        }
    }

    /// The model whose canonical name normalizes to `normalized`.
    pub(super) fn canonical(&self, normalized: &str) -> Option<&'static GpuModel> {
        self.canonical
            .get(normalized)
            .and_then(|position| CATALOGUE.get(*position))
    }

    /// The models `cloud` sells under a name that normalizes to `normalized`, in catalogue
    /// order.
    pub(super) fn sold_as(&self, cloud: Cloud, normalized: &str) -> Vec<&'static GpuModel> {
        self.positions(&[cloud], normalized)
    }

    /// The models either cloud sells under that name, in catalogue order, each once.
    pub(super) fn sold_by_either_as(&self, normalized: &str) -> Vec<&'static GpuModel> {
        self.positions(&[Cloud::RunPod, Cloud::VastAi], normalized)
    }

    /// Whether `cloud` sells anything under that name.
    pub(super) fn is_sold_as(&self, cloud: Cloud, normalized: &str) -> bool {
        self.on(cloud).contains_key(normalized)
    }

    fn positions(&self, clouds: &[Cloud], normalized: &str) -> Vec<&'static GpuModel> {
        let mut positions: Vec<usize> = clouds
            .iter()
            .filter_map(|cloud| self.on(*cloud).get(normalized))
            .flatten()
            .copied()
            .collect();
        positions.sort_unstable();
        positions.dedup();
        positions
            .into_iter()
            .filter_map(|position| CATALOGUE.get(position))
            .collect()
    }
}
