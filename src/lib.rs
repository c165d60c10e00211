//! The connector layer of mooncake-rs: what a Rust inference engine or
//! router runs on top of the [`mooncake`] crate to take part in
//! prefill/decode disaggregation (a vLLM `MooncakeConnector` equivalent).
//!
//! The connector itself comes with the connector issue; today this package
//! holds the pieces that tests, examples and the `mooncake-peer` tool share.
#![deny(missing_docs)]

pub mod connector;
pub mod peer_protocol;
pub mod sim;
pub mod testkit;
