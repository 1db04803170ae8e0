//! Tests of the RunPod v2 simulator over real HTTP with reqwest. Each test ends by checking
//! every recorded exchange against the OpenAPI contract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod auth_and_limits;
mod catalog;
mod contract;
mod create;
mod faults;
mod ledger_and_scenario;
mod lifecycle;
mod logs;
mod volumes;
