//! Engines that find each other through a metadata store, on real servers
//! on 127.0.0.1: etcd (one member, and a three-member cluster that loses a
//! member), Redis, our `mooncake-metadata-server` and upstream's Python HTTP
//! metadata server. Ours to ours through the safe API, and ours to the
//! upstream engine (PyPI `mooncake-transfer-engine-non-cuda==0.3.13.post1`)
//! in both directions through etcd and HTTP, with the keys checked in the
//! store. Redis is ours to ours only: the upstream wheel has no Redis
//! client.
//!
//! etcd and redis-server come from Debian (`.ci/run` installs them); without
//! them these tests are ignored, unless `MC_REQUIRE_METADATA_SERVERS=1`.
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mooncake::{Access, Engine, ErrorCode, HostBuffer, Metadata};
use mooncake_connector::testkit::{check_pattern, fill_pattern};
use support::stores::{which, Etcd, Redis};
use support::{cross_scenario, upstream_trial, Kind, PeerProc};

fn main() {
    let args = Arguments::from_args();
    let needs = |bin: &'static str, name: &'static str, f: fn()| {
        let t = Trial::test(name, move || wrap(f));
        if which(bin).is_some() || support::stores::servers_required() {
            t
        } else {
            eprintln!("skipped {name}: {bin} is not installed (.ci/run installs it)");
            t.with_ignored_flag(true)
        }
    };
    let tests = vec![
        Trial::test("builder_rules_for_segment_names", || {
            wrap(builder_rules_for_segment_names)
        }),
        needs(
            "etcd",
            "etcd_ours_to_ours_keys_and_removal",
            etcd_ours_to_ours_keys_and_removal,
        ),
        needs(
            "etcd",
            "etcd_cluster_loses_a_member",
            etcd_cluster_loses_a_member,
        ),
        needs("redis-server", "redis_ours_to_ours", redis_ours_to_ours),
        needs(
            "etcd",
            "etcd_lease_removes_a_crashed_engines_keys",
            etcd_lease_removes_a_crashed_engines_keys,
        ),
        needs(
            "redis-server",
            "redis_expiry_removes_a_crashed_engines_keys",
            redis_expiry_removes_a_crashed_engines_keys,
        ),
        Trial::test("http_ours_through_our_metadata_server", || {
            wrap(http_ours_through_our_metadata_server)
        }),
        upstream_trial("etcd_ours_and_upstream_both_ways", || {
            if Etcd::start(1).is_none() && !support::stores::servers_required() {
                eprintln!("etcd is not installed; nothing to check");
                return;
            }
            etcd_ours_and_upstream_both_ways()
        }),
        upstream_trial(
            "http_ours_and_upstream_through_our_server",
            http_ours_and_upstream_through_our_server,
        ),
        upstream_trial(
            "http_ours_through_upstreams_python_server",
            http_ours_through_upstreams_python_server,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}

fn wrap(f: fn()) -> Result<(), Failed> {
    f();
    Ok(())
}

fn engine(m: &Metadata, name: &str) -> Engine {
    Engine::builder()
        .metadata(m.clone())
        .segment_name(name)
        .metadata_timeout(Duration::from_millis(1500))
        .build()
        .unwrap_or_else(|e| panic!("engine {name} on {}: {e}", m.conn_string()))
}

/// `init` opens `target_name` through the store and moves 64 KiB each way,
/// checking the bytes.
fn transfer_both_ways(init: &Engine, target: &Engine, target_name: &str, seed: u64) {
    let mut mem = HostBuffer::new(1 << 20).unwrap();
    fill_pattern(&mut mem, seed, 0);
    let published = target.register(mem, "*", Access::RemoteAccessible).unwrap();
    let local = init
        .register(HostBuffer::new(1 << 17).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target_name).unwrap();
    let remote = seg.buffers().unwrap()[0];
    seg.read_sync(&local, 0, remote.addr + 4096, 65536).unwrap();
    let got = local.to_vec();
    assert_eq!(
        check_pattern(&got[..65536], seed, 4096),
        None,
        "first wrong byte"
    );
    seg.write_sync(&local, 0, remote.addr + (512 << 10), 65536)
        .unwrap();
    let mut there = vec![0u8; 65536];
    published.read_at(512 << 10, &mut there).unwrap();
    assert_eq!(there, got[..65536]);
}

fn builder_rules_for_segment_names() {
    let err = Engine::builder()
        .metadata("etcd://127.0.0.1:1".parse().unwrap())
        .build()
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("segment_name"), "{err}");
    let err = Engine::builder().segment_name("x").build().unwrap_err();
    assert!(err.to_string().contains("P2PHANDSHAKE"), "{err}");
    let err = Engine::builder()
        .metadata(Metadata::Http("https://127.0.0.1:1/metadata".into()))
        .segment_name("x")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
    // Nothing listens there: a metadata error at once, not a hang.
    let t0 = Instant::now();
    let err = Engine::builder()
        .metadata(Metadata::Http(format!(
            "http://127.0.0.1:{}/metadata",
            support::stores::free_port()
        )))
        .segment_name("x")
        .build()
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Metadata, "{err}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

fn etcd_ours_to_ours_keys_and_removal() {
    let etcd = Etcd::start(1).unwrap();
    let m: Metadata = etcd.conn().parse().unwrap();
    {
        let target = engine(&m, "prefill-7");
        let init = engine(&m, "decode-7");
        let rpc = etcd
            .get("mooncake/rpc_meta/prefill-7")
            .expect("rpc_meta key");
        assert_eq!(
            String::from_utf8(rpc).unwrap(),
            format!(
                "{{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":{}}}\n",
                target.rpc_port()
            )
        );
        transfer_both_ways(&init, &target, "prefill-7", 3);
        // The buffer was unregistered when transfer_both_ways returned: the
        // descriptor was published again without it.
        let ram = String::from_utf8(etcd.get("mooncake/ram/prefill-7").unwrap()).unwrap();
        assert!(
            ram.ends_with('\n') && ram.contains("\"buffers\":[]"),
            "{ram}"
        );
        assert!(ram.contains("\"name\":\"prefill-7\""), "{ram}");
    }
    assert!(
        etcd.get("mooncake/rpc_meta/prefill-7").is_none(),
        "removed at shutdown"
    );
    assert!(
        etcd.get("mooncake/ram/prefill-7").is_none(),
        "removed at shutdown"
    );
    assert!(
        etcd.get("mooncake/ram/decode-7").is_none(),
        "removed at shutdown"
    );
}

fn etcd_cluster_loses_a_member() {
    let mut etcd = Etcd::start(3).unwrap();
    let m: Metadata = etcd.conn().parse().unwrap();
    let target = engine(&m, "p");
    let init = engine(&m, "d");
    transfer_both_ways(&init, &target, "p", 5);
    // The first endpoint of every engine's list dies mid-test.
    etcd.members[0].kill();
    let late = engine(&m, "p2");
    transfer_both_ways(&init, &late, "p2", 6);
    assert!(etcd.get("mooncake/ram/p2").is_some());
}

fn redis_ours_to_ours() {
    let redis = Redis::start("pw-7").unwrap();
    let m = Metadata::Redis(redis.url());
    let build = |name: &str, pw: &str| {
        Engine::builder()
            .metadata(m.clone())
            .segment_name(name)
            .redis_auth(None, pw)
            .redis_db(2)
            .metadata_timeout(Duration::from_millis(1500))
            .build()
    };
    let err = build("x", "wrong").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Metadata);
    assert!(err.to_string().contains("authentication"), "{err}");
    {
        let target = build("r-target", "pw-7").unwrap();
        let init = build("r-init", "pw-7").unwrap();
        transfer_both_ways(&init, &target, "r-target", 8);
        // In DB 2, not DB 0, with upstream's trailing newline.
        assert_eq!(
            redis
                .command(&["EXISTS", "mooncake/ram/r-target"])
                .unwrap()
                .0,
            ":0"
        );
        let (line, v) = redis_db2_get(&redis, "mooncake/ram/r-target");
        assert!(line.starts_with('$'), "{line}");
        assert!(v.unwrap().ends_with(b"}\n"));
    }
    assert!(
        redis_db2_get(&redis, "mooncake/ram/r-target").1.is_none(),
        "removed at shutdown"
    );
}

/// Waits up to `within` for `gone()`; the time it took.
fn until_gone(within: Duration, gone: impl Fn() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if gone() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// A peer process publishes with a 2 s lease and is killed (SIGKILL: no
/// destructor, no DELETE). Its keys vanish once the lease runs out, while
/// a peer without a lease, killed the same way, leaves its keys behind
/// (upstream's behaviour). Before the kill the keys outlive several TTLs:
/// the engine keeps the lease alive.
fn etcd_lease_removes_a_crashed_engines_keys() {
    let etcd = Etcd::start(1).unwrap();
    let conn = etcd.conn();
    let leased = [
        "--metadata",
        &conn,
        "--name",
        "leased",
        "--metadata-lease-secs",
        "2",
    ];
    let mut with_lease = PeerProc::spawn_with(Kind::Ours, 1 << 20, 1, &leased);
    let mut without = peer(Kind::Ours, &conn, "plain", 2);
    std::thread::sleep(Duration::from_secs(5));
    assert!(etcd.get("mooncake/ram/leased").is_some(), "kept alive");
    assert!(etcd.get("mooncake/rpc_meta/leased").is_some(), "kept alive");
    with_lease.kill();
    without.kill();
    let gone = until_gone(Duration::from_secs(10), || {
        etcd.get("mooncake/ram/leased").is_none() && etcd.get("mooncake/rpc_meta/leased").is_none()
    });
    assert!(gone.is_some(), "the leased keys outlived the lease");
    assert!(etcd.get("mooncake/ram/plain").is_some());
    assert!(etcd.get("mooncake/rpc_meta/plain").is_some());
}

/// As [`etcd_lease_removes_a_crashed_engines_keys`], with Redis expiry.
fn redis_expiry_removes_a_crashed_engines_keys() {
    let redis = Redis::start("pw-9").unwrap();
    let url = redis.url();
    let exists = |key: &str| redis.command(&["EXISTS", key]).unwrap().0 == ":1";
    let args = |name: &'static str, lease: &'static str| {
        let v: Vec<String> = [
            "--metadata",
            &url,
            "--name",
            name,
            "--redis-password",
            "pw-9",
        ]
        .into_iter()
        .map(str::to_string)
        .chain(["--metadata-lease-secs".to_string(), lease.to_string()])
        .collect();
        v
    };
    let spawn = |name: &'static str, lease: &'static str, seed: u64| {
        let a = args(name, lease);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        PeerProc::spawn_with(Kind::Ours, 1 << 20, seed, &a)
    };
    let mut with_lease = spawn("leased", "2", 1);
    let mut without = spawn("plain", "0", 2);
    std::thread::sleep(Duration::from_secs(5));
    assert!(exists("mooncake/ram/leased"), "kept alive");
    with_lease.kill();
    without.kill();
    let gone = until_gone(Duration::from_secs(10), || {
        !exists("mooncake/ram/leased") && !exists("mooncake/rpc_meta/leased")
    });
    assert!(gone.is_some(), "the expiring keys outlived their TTL");
    assert!(exists("mooncake/ram/plain") && exists("mooncake/rpc_meta/plain"));
}

fn redis_db2_get(redis: &Redis, key: &str) -> (String, Option<Vec<u8>>) {
    // SELECT and GET in one MULTI-less pipeline: EVAL keeps it one reply.
    let script = format!("redis.call('SELECT', 2); return redis.call('GET', '{key}')");
    redis.command(&["EVAL", &script, "0"]).unwrap()
}

/// Our `mooncake-metadata-server`; stopped on drop.
struct OurServer {
    child: Child,
    url: String,
}

impl OurServer {
    fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mooncake-metadata-server"))
            .args(["--port", "0", "--log-level", "warning"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("mooncake-metadata-server listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Self { child, url }
    }
    fn get(&self, key: &str) -> Option<(u16, Vec<u8>)> {
        let rest = self.url.strip_prefix("http://127.0.0.1:").unwrap();
        let (port, path) = rest.split_once('/').unwrap();
        let enc: String = key
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        support::stores::http(
            port.parse().unwrap(),
            "GET",
            &format!("/{path}?key={enc}"),
            b"",
        )
    }
}

impl Drop for OurServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_ours_through_our_metadata_server() {
    let server = OurServer::start();
    let m = Metadata::Http(server.url.clone());
    {
        let target = engine(&m, "h:target");
        let init = engine(&m, "h:init");
        transfer_both_ways(&init, &target, "h:target", 9);
        let (status, body) = server.get("mooncake/ram/h:target").unwrap();
        assert_eq!(status, 200);
        assert!(body.ends_with(b"}"), "no trailing newline over HTTP");
    }
    assert_eq!(
        server.get("mooncake/ram/h:target").unwrap().0,
        404,
        "removed at shutdown"
    );
    assert_eq!(
        server.get("mooncake/rpc_meta/h:target").unwrap().0,
        404,
        "removed at shutdown"
    );
}

fn peer(kind: Kind, conn: &str, name: &str, seed: u64) -> PeerProc {
    PeerProc::spawn_with(kind, 8 << 20, seed, &["--metadata", conn, "--name", name])
}

fn etcd_ours_and_upstream_both_ways() {
    let etcd = Etcd::start(1).unwrap();
    let conn = etcd.conn();
    {
        let mut target = peer(Kind::Ours, &conn, "ours-target", 51);
        let mut init = peer(Kind::Upstream, &conn, "upstream-init", 52);
        cross_scenario(&mut init, &mut target, 51);
    }
    {
        let mut target = peer(Kind::Upstream, &conn, "upstream-target", 61);
        let mut init = peer(Kind::Ours, &conn, "ours-init", 62);
        // Upstream's keys, as our engine reads them.
        let rpc =
            String::from_utf8(etcd.get("mooncake/rpc_meta/upstream-target").unwrap()).unwrap();
        assert!(rpc.contains("\"rpc_port\""), "{rpc}");
        cross_scenario(&mut init, &mut target, 61);
    }
    for name in [
        "ours-target",
        "ours-init",
        "upstream-init",
        "upstream-target",
    ] {
        assert!(
            etcd.get(&format!("mooncake/ram/{name}")).is_none(),
            "{name}: ram key left behind"
        );
    }
}

fn http_ours_and_upstream_through_our_server() {
    let server = OurServer::start();
    {
        let mut target = peer(Kind::Ours, &server.url, "ours-t", 71);
        let mut init = peer(Kind::Upstream, &server.url, "up-i", 72);
        cross_scenario(&mut init, &mut target, 71);
    }
    {
        let mut target = peer(Kind::Upstream, &server.url, "up-t", 81);
        let mut init = peer(Kind::Ours, &server.url, "ours-i", 82);
        cross_scenario(&mut init, &mut target, 81);
    }
    assert_eq!(server.get("mooncake/ram/ours-t").unwrap().0, 404);
}

fn http_ours_through_upstreams_python_server() {
    let py = support::upstream_python().unwrap();
    let port = support::stores::free_port();
    let mut child = Command::new(py)
        .args(["-m", "mooncake.http_metadata_server", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string(), "--log-level", "WARNING"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "upstream's server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let m = Metadata::Http(format!("http://127.0.0.1:{port}/metadata"));
    {
        let target = engine(&m, "py-target");
        let init = engine(&m, "py-init");
        transfer_both_ways(&init, &target, "py-target", 11);
        // Upstream's server refuses a second rpc_meta under one name: the
        // error says which key to delete.
        let err = Engine::builder()
            .metadata(m.clone())
            .segment_name("py-target")
            .build()
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Metadata);
        assert!(
            err.to_string().contains("mooncake/rpc_meta/py-target"),
            "{err}"
        );
    }
    // Both engines removed their keys: the name can be used again.
    drop(engine(&m, "py-target"));
    let _ = child.kill();
    let _ = child.wait();
}
