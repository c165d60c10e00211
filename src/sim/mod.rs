//! A simulated serving engine around the connector: the model whose KV the
//! examples move, the prefill/decode engine and its OpenAI-style HTTP API,
//! the proxy, and real models' KV-cache layouts for the KV benchmark.

pub mod blocks;
pub mod cli;
pub mod compute_pool;
pub mod engine;
pub mod kv_check;
pub mod kv_layouts;
pub mod model;
pub mod proxy;
pub mod request;
pub mod server;
