//! `runpod.io/provider: cheapest`: what each cloud the pod may use would charge for the
//! cheapest GPU type that fits it, from the prices its virtual nodes publish. The rule lives in
//! the contract (`gpus::pod_price`), shared with the controller's budget gate.

pub use runpod_contract::gpus::pod_price::price_on;
pub(super) use runpod_contract::gpus::pod_price::{fits_on, runpod_annotations, sides};
