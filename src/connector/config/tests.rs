//! Unit tests of the connector's configuration parsing.
use super::*;
use std::collections::HashMap;

#[test]
fn seed_guide_configs_parse_with_defaults() {
    let p = KvTransferConfig::from_json(
        r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}"#,
    )
    .unwrap();
    assert_eq!(p.kv_role, KvRole::Producer);
    assert_eq!(p.num_workers, 10);
    assert_eq!(p.mooncake_protocol, MooncakeProtocol::Rdma);
    assert!(p.device_name.is_empty());
    assert!(p.bootstrap_server_address.is_none());
    assert_eq!(p.metadata_server, Metadata::P2pHandshake);
    assert_eq!(p.kv_load_failure_policy, LoadFailurePolicy::Fail);
    assert_eq!(
        uuid::Uuid::parse_str(&p.engine_id)
            .unwrap()
            .get_version_num(),
        4
    );
    let c = KvTransferConfig::from_json(
        r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer","engine_id":"d0",
            "kv_connector_extra_config":{"num_workers":4,"mooncake_protocol":"tcp",
            "device_name":"mlx5_0, mlx5_1","bootstrap_server_address":"10.0.0.1:9000"},
            "kv_load_failure_policy":"recompute","kv_buffer_size":1e9}"#,
    )
    .unwrap();
    assert_eq!(c.kv_role, KvRole::Consumer);
    assert_eq!(c.engine_id, "d0");
    assert_eq!(c.num_workers, 4);
    assert_eq!(c.mooncake_protocol, MooncakeProtocol::Tcp);
    assert_eq!(c.device_name, ["mlx5_0", "mlx5_1"]);
    assert_eq!(
        c.bootstrap_server_address,
        Some(HostPort {
            host: "10.0.0.1".into(),
            port: 9000
        })
    );
    assert_eq!(c.kv_load_failure_policy, LoadFailurePolicy::Recompute);
}

#[test]
fn metadata_server_selects_a_store() {
    let parse = |m: &str| {
        KvTransferConfig::from_json(&format!(
            r#"{{"kv_connector":"MooncakeConnector","kv_role":"kv_both",
                "kv_connector_extra_config":{{"metadata_server":"{m}"}}}}"#
        ))
    };
    assert_eq!(
        parse("etcd://10.0.0.1:2379,10.0.0.2:2379")
            .unwrap()
            .metadata_server,
        Metadata::Etcd(vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()])
    );
    assert_eq!(
        parse("http://10.0.0.1:8080/metadata")
            .unwrap()
            .metadata_server,
        Metadata::Http("http://10.0.0.1:8080/metadata".into())
    );
    assert_eq!(
        parse("P2PHANDSHAKE").unwrap().metadata_server,
        Metadata::P2pHandshake
    );
    let e = parse("ftp://x").unwrap_err().to_string();
    assert!(
        e.contains("metadata_server") && e.contains("unknown scheme"),
        "{e}"
    );
}

#[test]
fn bad_values_name_their_key() {
    let cases = [
        (r#"{"kv_role":"kv_producer"}"#, "kv_connector"),
        (
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_producer"}"#,
            "kv_connector",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"producer"}"#,
            "kv_role",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"num_workers":0}}"#,
            "num_workers",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"num_workers":"8"}}"#,
            "num_workers",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"mooncake_protocol":"nvlink"}}"#,
            "mooncake_protocol",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"bootstrap_server_address":":8998"}}"#,
            "bootstrap_server_address",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"bootstrap_server_address":"h:0"}}"#,
            "bootstrap_server_address",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"bootstrap_server_address":"h:70000"}}"#,
            "bootstrap_server_address",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"device_name":7}}"#,
            "device_name",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_connector_extra_config":{"metadata_server":3}}"#,
            "metadata_server",
        ),
        (
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both","kv_load_failure_policy":"retry"}"#,
            "kv_load_failure_policy",
        ),
        (r#"not json"#, "kv_transfer_config"),
    ];
    for (text, key) in cases {
        let e = KvTransferConfig::from_json(text).unwrap_err();
        assert!(e.to_string().contains(key), "{text}: {e}");
    }
}

#[test]
fn env_defaults_and_errors() {
    let env = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ConnectorEnv::from_lookup(move |k| m.get(k).cloned())
    };
    let d = env(&[("VLLM_HOST_IP", "127.0.0.1")]).unwrap();
    assert_eq!(d.bootstrap_port, 8998);
    assert_eq!(d.connector_timeout, Duration::from_secs(30));
    assert_eq!(d.abort_request_timeout, Duration::from_secs(480));
    assert_eq!(d.receive_timeout(), Duration::from_secs(540));
    let e = env(&[
        ("VLLM_MOONCAKE_BOOTSTRAP_PORT", "9000"),
        ("VLLM_MOONCAKE_CONNECTOR_TIMEOUT", "2.5"),
        ("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", "3"),
        ("VLLM_HOST_IP", "10.1.2.3"),
    ])
    .unwrap();
    assert_eq!(e.bootstrap_port, 9000);
    assert_eq!(e.connector_timeout, Duration::from_millis(2500));
    assert_eq!(e.abort_request_timeout, Duration::from_secs(3));
    assert_eq!(e.host_ip, "10.1.2.3");
    for (k, v) in [
        ("VLLM_MOONCAKE_BOOTSTRAP_PORT", "0"),
        ("VLLM_MOONCAKE_BOOTSTRAP_PORT", "x"),
        ("VLLM_MOONCAKE_CONNECTOR_TIMEOUT", "-1"),
        ("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", "2.5"),
        ("VLLM_HOST_IP", "not-an-ip"),
    ] {
        let err = env(&[(k, v)]).unwrap_err();
        assert!(err.to_string().contains(k), "{k}={v}: {err}");
    }
}

#[test]
fn an_empty_bootstrap_token_is_no_token() {
    let get =
        |v: &'static str| move |k: &str| (k == "MOONCAKE_BOOTSTRAP_TOKEN").then(|| v.to_string());
    assert_eq!(bootstrap_token(get("")), None);
    assert_eq!(bootstrap_token(get("s3cret")).as_deref(), Some("s3cret"));
    assert_eq!(bootstrap_token(|_: &str| None), None);
}
