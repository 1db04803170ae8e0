//! What the RunPod client tests share: a placement candidate and the create request built
//! for it (a `mod runpod_support;` in each test crate that needs them).

use std::collections::BTreeMap;

use runpod_contract::CloudType;
use runpod_kubelet::runpod::model::{CreatePodRequest, GpuSpec};
use runpod_kubelet::runpod::select::Candidate;

/// One GPU of type `gpu` on Secure Cloud, in these data centres (empty: RunPod chooses).
pub fn candidate(gpu: &str, data_centers: &[&str]) -> Candidate {
    Candidate {
        gpu_id: gpu.to_owned(),
        gpu_count: 1,
        cloud: CloudType::Secure,
        data_center_ids: data_centers.iter().map(|dc| (*dc).to_owned()).collect(),
        price_per_gpu: 0.5,
        price_per_hour: 0.5,
        memory_gb: Some(24),
    }
}

/// The create request for `name` on a candidate: a plain training container.
pub fn request_for(name: &str) -> impl Fn(&Candidate) -> CreatePodRequest + use<> {
    let name = name.to_owned();
    move |candidate: &Candidate| CreatePodRequest {
        name: name.clone(),
        image: Some("runpod/pytorch:2.4.0".to_owned()),
        template_id: None,
        gpu: GpuSpec {
            id: candidate.gpu_id.clone(),
            count: candidate.gpu_count,
        },
        cloud: candidate.cloud.as_str().to_owned(),
        data_center_ids: candidate.data_center_ids.clone(),
        disk: Some(20),
        ports: vec!["8888/http".to_owned(), "22/tcp".to_owned()],
        env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
        args: Some("python train.py".to_owned()),
        registry: None,
        mounts: None,
    }
}
