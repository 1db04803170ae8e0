//! One module per subcommand: each parses what its flags mean and wires the library to them.

pub mod adopt;
pub mod certs;
pub mod controller;
pub mod gpus;
pub mod registration;
#[cfg(feature = "simulator")]
pub mod simulator;
pub mod webhook;
