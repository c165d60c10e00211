//! The connector layer of mooncake-rs: what a Rust inference engine or
//! router runs on top of the [`mooncake`] crate to take part in
//! prefill/decode disaggregation (a vLLM `MooncakeConnector` equivalent).
//!
//! [`connector::Connector::start`] is the entry point; [`sim`] is a
//! simulated serving engine built on it, and [`testkit`] and
//! [`peer_protocol`] hold what tests, examples and `mooncake-peer` share.
#![deny(missing_docs)]

pub mod connector;
pub mod peer_protocol;
pub mod sim;
pub mod testkit;
