//! One module per subcommand: each parses what its flags mean and wires the library to them.

pub(crate) mod adopt;
pub(crate) mod certs;
pub(crate) mod controller;
pub(crate) mod gpus;
pub(crate) mod registration;
#[cfg(feature = "simulator")]
pub(crate) mod simulator;
pub(crate) mod webhook;
