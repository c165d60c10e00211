//! A simulated serving engine around the connector: the model whose KV the
//! examples move, the prefill/decode engine and its OpenAI-style HTTP API,
//! and the proxy.

pub mod blocks;
pub mod cli;
pub mod engine;
pub mod model;
pub mod proxy;
pub mod server;
