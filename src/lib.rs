//! The connector layer of mooncake-rs: what a Rust inference engine or
//! router runs on top of the [`mooncake`] crate to take part in
//! prefill/decode disaggregation (a vLLM `MooncakeConnector` equivalent).
//!
//! [`connector::Connector::start`] is the entry point; [`sim`] is a
//! simulated serving engine built on it, and [`testkit`] and
//! [`peer_protocol`] hold what tests, examples and `mooncake-peer` share.
//! [`metadata_server`] is the HTTP metadata service behind the
//! `mooncake-metadata-server` binary.
#![deny(missing_docs)]

pub mod connector;
pub mod metadata_server;
pub mod peer_protocol;
pub mod sim;
pub mod testkit;
