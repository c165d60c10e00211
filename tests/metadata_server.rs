//! The HTTP metadata server (`mooncake_connector::metadata_server` and the
//! `mooncake-metadata-server` binary) over real HTTP on 127.0.0.1: every
//! request and answer of upstream's protocol, encoded keys, the rpc_meta
//! rule, the caps and timeouts; and, where upstream's Python server can
//! run (the upstream wheel with aiohttp, as scripts/install-test-deps.sh
//! installs it), the same request sequence against both servers.
//!
//! Whether upstream's server can run is known only at run time, so this
//! file has its own `main` (libtest-mimic): without it, that comparison is
//! reported as *ignored* with the reason, or fails where CI sets
//! MOONCAKE_REQUIRE_UPSTREAM=1.
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mooncake_connector::metadata_server::{serve, Config, Limits};

fn main() {
    let args = Arguments::from_args();
    let tests = vec![
        Trial::test("methods_and_answers", wrap(methods_and_answers)),
        Trial::test("encoded_keys", wrap(encoded_keys)),
        Trial::test("rpc_meta_rule_and_opt_in", wrap(rpc_meta_rule_and_opt_in)),
        Trial::test("caps_answer_clearly", wrap(caps_answer_clearly)),
        Trial::test(
            "slow_and_idle_clients_do_not_block_others",
            wrap(slow_and_idle_clients_do_not_block_others),
        ),
        Trial::test(
            "slow_reader_is_closed_at_the_response_deadline",
            wrap(slow_reader_is_closed_at_the_response_deadline),
        ),
        Trial::test("per_ip_connection_cap", wrap(per_ip_connection_cap)),
        Trial::test(
            "inflight_body_budget_answers_503_and_is_released",
            wrap(inflight_body_budget_answers_503_and_is_released),
        ),
        Trial::test(
            "binary_serves_and_stops_on_sigterm",
            wrap(binary_serves_and_stops_on_sigterm),
        ),
        upstream_trial(),
        support::upstream_trial(
            "upstream_engines_through_our_server",
            upstream_engines_through_our_server,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}

fn wrap(f: fn()) -> impl FnOnce() -> Result<(), Failed> + Send + 'static {
    move || {
        f();
        Ok(())
    }
}

// ---------------------------------------------------------------- server

/// Our server in this process, on a free port, stopped on drop.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(config: Config) -> Self {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                serve(listener, config, async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        Self {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    fn conn(&self) -> Conn {
        Conn::open(self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------- client

/// One keep-alive HTTP/1.1 connection, written by hand so that tests
/// control every byte of the request line (encodings, slow senders).
struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Resp {
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
}

impl Resp {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Conn {
    fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Self { stream, reader }
    }

    /// Sends one request (the target exactly as given) and reads its
    /// answer; `body` goes with a Content-Length, as upstream's engine
    /// sends it.
    fn send(&mut self, method: &str, target: &str, body: Option<&[u8]>) -> Resp {
        let mut req = format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n");
        if let Some(b) = body {
            req += &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            );
        }
        req += "\r\n";
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        self.stream.write_all(&bytes).unwrap();
        self.read_response(method == "HEAD")
    }

    fn read_response(&mut self, head: bool) -> Resp {
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            let status: u16 = line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("bad status line {line:?}"));
            let mut len = 0usize;
            let mut content_type = None;
            let mut chunked = false;
            loop {
                let mut h = String::new();
                self.reader.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (name, value) = h.split_once(':').unwrap();
                let value = value.trim().to_string();
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => len = value.parse().unwrap(),
                    "content-type" => content_type = Some(value),
                    "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                    _ => {}
                }
            }
            if (100..200).contains(&status) {
                continue;
            }
            assert!(!chunked, "chunked answers are not expected here");
            let mut body = vec![0u8; if head { 0 } else { len }];
            self.reader.read_exact(&mut body).unwrap();
            return Resp {
                status,
                content_type,
                body,
            };
        }
    }

    fn get(&mut self, key: &str) -> Resp {
        self.send("GET", &target(key), None)
    }

    fn put(&mut self, key: &str, body: &[u8]) -> Resp {
        self.send("PUT", &target(key), Some(body))
    }

    fn delete(&mut self, key: &str) -> Resp {
        self.send("DELETE", &target(key), None)
    }

    /// Whether the server closes this connection (EOF or reset) within
    /// `within`; whatever it sends before is skipped.
    fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut b = [0u8; 256];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            match self.reader.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                Err(_) => return true,
            }
        }
    }
}

/// Percent-encodes as upstream's engine does (curl_easy_escape):
/// everything but ALPHA, DIGIT and `-._~`.
fn enc(key: &str) -> String {
    key.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn target(key: &str) -> String {
    format!("/metadata?key={}", enc(key))
}

const JSON_TEXT: &str = "application/json; charset=utf-8";

fn assert_answer(r: &Resp, status: u16, body: &str) {
    assert_eq!((r.status, r.text().as_str()), (status, body), "{r:?}");
}

// ---------------------------------------------------------------- tests

fn methods_and_answers() {
    let server = Server::start(Config::default());
    let mut c = server.conn();
    // No key, an empty key, a blank key: 400 for every method.
    for method in ["GET", "PUT", "DELETE", "POST"] {
        for t in [
            "/metadata",
            "/metadata?key=",
            "/metadata?key=%20%20",
            "/metadata?other=1",
        ] {
            let r = c.send(method, t, (method == "PUT").then_some(b"{}"));
            assert_answer(&r, 400, "metadata key is required");
            assert_eq!(r.content_type.as_deref(), Some(JSON_TEXT));
        }
    }
    let key = "mooncake/ram/127.0.0.1:12345";
    let r = c.get(key);
    assert_answer(&r, 404, "metadata not found");
    assert_eq!(r.content_type.as_deref(), Some(JSON_TEXT));
    let doc = br#"{"name":"127.0.0.1:12345","buffers":[{"addr":1,"length":2}]}"#;
    let r = c.put(key, doc);
    assert_answer(&r, 200, "metadata updated");
    assert_eq!(r.content_type.as_deref(), Some(JSON_TEXT));
    let r = c.get(key);
    assert_eq!((r.status, r.body.as_slice()), (200, &doc[..]));
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    // PUT replaces; bodies are stored byte for byte, JSON or not.
    for body in [&b"not json\n"[..], b"", b"{\"x\": 1}\r\n"] {
        assert_answer(&c.put(key, body), 200, "metadata updated");
        assert_eq!(c.get(key).body, body);
    }
    // Other methods on /metadata: 405, after the key check.
    for method in ["POST", "PATCH", "OPTIONS", "HEAD"] {
        let r = c.send(method, &target(key), None);
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.content_type.as_deref(), Some(JSON_TEXT));
        if method != "HEAD" {
            assert_eq!(r.text(), "Method not allowed");
        }
    }
    assert_answer(&c.delete(key), 200, "metadata deleted");
    assert_answer(&c.delete(key), 404, "metadata not found");
    assert_answer(&c.get(key), 404, "metadata not found");
    // Other paths: aiohttp's plain 404; the path is percent-decoded first.
    for t in [
        "/",
        "/metadata/?key=a",
        "/METADATA?key=a",
        "/meta?key=a",
        "//metadata?key=a",
    ] {
        let r = c.send("GET", t, None);
        assert_answer(&r, 404, "404: Not Found");
        assert_eq!(r.content_type.as_deref(), Some("text/plain; charset=utf-8"));
    }
    assert_answer(&c.put("p", b"1"), 200, "metadata updated");
    assert_answer(&c.send("GET", "/%6Detadata?key=p", None), 200, "1");
    // Beyond upstream's Python server, as its C++ one: a health check.
    assert_answer(&c.send("GET", "/health", None), 200, "OK");
}

fn encoded_keys() {
    let server = Server::start(Config::default());
    let mut c = server.conn();
    let keys = [
        "mooncake/ram/10.0.0.1:1234",
        "mooncake/rpc_meta/host-a:5",
        "mooncake/cluster-1/ram/seg",
        "a+b&c=d?e/f:g#h%i;j",
        "unicode/\u{e9}\u{20ac}",
    ];
    for (i, k) in keys.iter().enumerate() {
        let v = format!("{{\"i\":{i}}}");
        assert_answer(&c.put(k, v.as_bytes()), 200, "metadata updated");
        assert_eq!(c.get(k).text(), v, "{k}");
        // Surrounding whitespace is stripped (the key is the same).
        assert_eq!(c.get(&format!("  {k}\t")).text(), v, "{k}");
    }
    // `+` and `&` must be encoded to reach the key: raw, `+` is a space
    // and `&` ends the parameter.
    assert_answer(
        &c.send(
            "GET",
            "/metadata?key=a+b%26c%3Dd%3Fe%2Ff%3Ag%23h%25i%3Bj",
            None,
        ),
        404,
        "metadata not found",
    );
    assert_answer(&c.put("a b", b"space"), 200, "metadata updated");
    assert_answer(&c.send("GET", "/metadata?key=a+b", None), 200, "space");
    assert_answer(
        &c.send("GET", "/metadata?key=a&b", None),
        404,
        "metadata not found",
    );
    // The first key parameter counts; the parameter name is decoded too.
    assert_answer(
        &c.send("GET", "/metadata?key=a+b&key=zz", None),
        200,
        "space",
    );
    assert_answer(&c.send("GET", "/metadata?k%65y=a%20b", None), 200, "space");
    // Lower-case escapes are the same key; malformed ones stay literal.
    assert_eq!(
        c.send(
            "GET",
            "/metadata?key=mooncake%2fram%2f10.0.0.1%3a1234",
            None
        )
        .text(),
        "{\"i\":0}"
    );
    assert_answer(
        &c.send("PUT", "/metadata?key=%ZZ", Some(b"z")),
        200,
        "metadata updated",
    );
    assert_answer(&c.send("GET", "/metadata?key=%25ZZ", None), 200, "z");
    // Each deletes once.
    for k in keys {
        assert_answer(&c.delete(&format!(" {k} ")), 200, "metadata deleted");
        assert_answer(&c.delete(k), 404, "metadata not found");
    }
}

fn rpc_meta_rule_and_opt_in() {
    let rpc = "mooncake/rpc_meta/127.0.0.1:15000";
    let ram = "mooncake/ram/127.0.0.1:15000";
    // Default: as upstream, an existing rpc_meta key is not overwritten.
    let server = Server::start(Config::default());
    let mut c = server.conn();
    assert_answer(&c.put(rpc, b"{\"v\":1}"), 200, "metadata updated");
    let r = c.put(rpc, b"{\"v\":2}");
    assert_answer(&r, 400, "Duplicate rpc_meta key not allowed");
    assert_eq!(r.content_type.as_deref(), Some(JSON_TEXT));
    // Even with the same value, and with spaces around the key.
    assert_answer(
        &c.put(&format!(" {rpc} "), b"{\"v\":1}"),
        400,
        "Duplicate rpc_meta key not allowed",
    );
    assert_eq!(c.get(rpc).text(), "{\"v\":1}");
    // Other keys are overwritten freely.
    assert_answer(&c.put(ram, b"1"), 200, "metadata updated");
    assert_answer(&c.put(ram, b"2"), 200, "metadata updated");
    // Deleting the stale key lets the restarted engine publish again.
    assert_answer(&c.delete(rpc), 200, "metadata deleted");
    assert_answer(&c.put(rpc, b"{\"v\":3}"), 200, "metadata updated");
    drop(c);
    drop(server);

    // Opt-in: a restarted engine re-publishes in place.
    let server = Server::start(Config {
        allow_rpc_meta_overwrite: true,
        ..Config::default()
    });
    let mut c = server.conn();
    assert_answer(&c.put(rpc, b"{\"v\":1}"), 200, "metadata updated");
    assert_answer(&c.put(rpc, b"{\"v\":2}"), 200, "metadata updated");
    assert_eq!(c.get(rpc).text(), "{\"v\":2}");
}

fn caps_answer_clearly() {
    let server = Server::start(Config {
        limits: Limits {
            max_keys: 4,
            max_total_bytes: 120,
            max_key_bytes: 32,
        },
        max_body_bytes: 100,
        ..Config::default()
    });
    let mut other = server.conn();
    assert_answer(&other.put("keep", b"kept"), 200, "metadata updated");

    // Body over the limit, declared: refused before it is read.
    let mut c = server.conn();
    let r = c.put("big", &[b'x'; 101]);
    assert_answer(&r, 413, "Maximum request body size 100 exceeded.");
    assert_eq!(r.content_type.as_deref(), Some("text/plain; charset=utf-8"));
    // Undeclared (chunked): refused once it passes the limit.
    let mut c = server.conn();
    let mut req =
        b"PUT /metadata?key=big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        req.extend_from_slice(b"28\r\n");
        req.extend_from_slice(&[b'y'; 40]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    c.stream.write_all(&req).unwrap();
    let r = c.read_response(false);
    assert_eq!(r.status, 413, "{r:?}");
    // Exactly at the limit is fine.
    let mut c = server.conn();
    assert_answer(&c.put("at-limit", &[b'z'; 100]), 200, "metadata updated");
    assert_answer(&c.delete("at-limit"), 200, "metadata deleted");

    // Key too long (after decoding and stripping).
    let r = c.put(&"k".repeat(33), b"1");
    assert_eq!(r.status, 414, "{r:?}");
    assert!(r.text().contains("too long"), "{r:?}");
    assert_answer(
        &c.put(&format!("  {}  ", "k".repeat(32)), b"1"),
        200,
        "metadata updated",
    );

    // Too many keys: 507; replacing an existing key still works.
    assert_answer(&c.put("k2", b"1"), 200, "metadata updated");
    assert_answer(&c.put("k3", b"1"), 200, "metadata updated");
    let r = c.put("k4", b"1");
    assert_eq!(r.status, 507, "{r:?}");
    assert!(r.text().contains("key limit"), "{r:?}");
    assert_answer(&c.put("k3", b"22"), 200, "metadata updated");
    // Too many bytes: 507, nothing changed.
    assert_answer(&c.delete("k3"), 200, "metadata deleted");
    let r = c.put("k3", &[b'v'; 100]);
    assert_eq!(r.status, 507, "{r:?}");
    assert!(r.text().contains("bytes"), "{r:?}");
    assert_answer(&c.get("k3"), 404, "metadata not found");

    // Through all of it the server kept serving.
    assert_answer(&other.get("keep"), 200, "kept");
    assert_answer(&server.conn().get("keep"), 200, "kept");
}

fn slow_and_idle_clients_do_not_block_others() {
    let idle_timeout = Duration::from_millis(1200);
    let server = Server::start(Config {
        idle_timeout,
        request_timeout: Duration::from_millis(1500),
        ..Config::default()
    });
    // One client sends half a request line and stops; another trickles
    // header bytes; another connects and sends nothing.
    let mut half = server.conn();
    half.stream.write_all(b"PUT /metadata?key=sl").unwrap();
    let mut trickle = server.conn();
    let mut idle = server.conn();
    let start = Instant::now();
    let mut c = server.conn();
    for i in 0..10 {
        let _ = trickle.stream.write_all(b"X");
        let k = format!("k{i}");
        assert_answer(&c.put(&k, b"1"), 200, "metadata updated");
        assert_answer(&c.get(&k), 200, "1");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Others were served while the stalled ones were still held open
    // (none is closed before the idle timeout).
    assert!(start.elapsed() < idle_timeout, "{:?}", start.elapsed());
    // The stalled ones are closed by their timeouts (trickling does not
    // extend the request timeout).
    for (name, conn) in [
        ("half", &mut half),
        ("trickle", &mut trickle),
        ("idle", &mut idle),
    ] {
        let _ = conn.stream.write_all(b"X");
        assert!(
            conn.closed_within(Duration::from_secs(4)),
            "{name} still open"
        );
    }
    // A keep-alive connection idle too long is closed; a new one works.
    std::thread::sleep(idle_timeout.saturating_sub(start.elapsed()));
    assert!(c.closed_within(Duration::from_secs(2)));
    assert_answer(&server.conn().get("k0"), 200, "1");
}

/// Reads and discards until EOF or a reset (`Some(bytes read)`), or
/// `None` if the connection stays open for `within`.
fn drain_until_closed(c: &mut Conn, within: Duration) -> Option<usize> {
    let deadline = Instant::now() + within;
    let mut total = 0;
    let mut b = vec![0u8; 1 << 16];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        c.stream.set_read_timeout(Some(left)).unwrap();
        match c.reader.read(&mut b) {
            Ok(0) => return Some(total),
            Ok(n) => total += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            Err(_) => return Some(total),
        }
    }
}

fn slow_reader_is_closed_at_the_response_deadline() {
    let request_timeout = Duration::from_millis(1000);
    let server = Server::start(Config {
        max_body_bytes: 4 << 20,
        idle_timeout: Duration::from_secs(10),
        request_timeout,
        ..Config::default()
    });
    let value = vec![b'v'; 4 << 20];
    let mut c = server.conn();
    assert_answer(&c.put("big", &value), 200, "metadata updated");
    // A fast reader gets it whole; and a keep-alive connection idle for
    // longer than the request timeout (but not the idle one) still works.
    let r = c.get("big");
    assert_eq!((r.status, r.body.len()), (200, value.len()));
    std::thread::sleep(request_timeout + Duration::from_millis(300));
    assert_answer(&c.put("small", b"1"), 200, "metadata updated");

    // A slow reader asks for 64 MiB (16 pipelined GETs) and reads a few
    // KiB every 50 ms: without a deadline on answers it would get them all.
    let mut slow = server.conn();
    let asked = 16 * value.len();
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", target("big")).repeat(16);
    slow.stream.write_all(req.as_bytes()).unwrap();
    let start = Instant::now();
    let mut got = 0;
    let mut b = [0u8; 4096];
    while start.elapsed() < request_timeout * 2 + Duration::from_millis(500) {
        match slow.reader.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
        // Everyone else is served meanwhile.
        assert_answer(&c.get("small"), 200, "1");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The server has closed it: what remains buffered, then EOF, well
    // short of everything asked for.
    let rest = drain_until_closed(&mut slow, Duration::from_secs(5))
        .expect("the slow reader's connection is still open");
    assert!(got + rest < asked, "got {} of {asked}", got + rest);
    assert_answer(&server.conn().get("small"), 200, "1");
}

fn per_ip_connection_cap() {
    let server = Server::start(Config {
        max_connections_per_ip: 2,
        ..Config::default()
    });
    let mut a = server.conn();
    let mut b = server.conn();
    assert_answer(&a.put("k", b"1"), 200, "metadata updated");
    assert_answer(&b.get("k"), 200, "1");
    // A third from the same address is closed at once.
    let mut extra = server.conn();
    assert!(
        extra.closed_within(Duration::from_secs(2)),
        "third still open"
    );
    // Those under the cap keep working.
    assert_answer(&a.get("k"), 200, "1");
    assert_answer(&b.get("k"), 200, "1");
    // Once one closes, its place is free again.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut c = server.conn();
        c.stream
            .write_all(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", target("k")).as_bytes())
            .unwrap();
        let mut line = String::new();
        if c.reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            assert!(line.starts_with("HTTP/1.1 200"), "{line:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no place freed after a close");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_answer(&b.get("k"), 200, "1");
}

/// Sends the head of a PUT declaring `len` body bytes, and `part` of them.
fn put_partial(server: &Server, key: &str, len: usize, part: usize) -> Conn {
    let mut c = server.conn();
    let head = format!(
        "PUT {} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n",
        target(key)
    );
    c.stream.write_all(head.as_bytes()).unwrap();
    c.stream.write_all(&vec![b'p'; part]).unwrap();
    c
}

fn inflight_body_budget_answers_503_and_is_released() {
    let server = Server::start(Config {
        max_body_bytes: 1000,
        max_inflight_body_bytes: 1500,
        ..Config::default()
    });
    let mut other = server.conn();
    // One body of 1000 bytes under way holds 1000 of the 1500.
    let mut held = put_partial(&server, "held", 1000, 10);
    std::thread::sleep(Duration::from_millis(300));
    // Another 1000 does not fit: 503, clearly.
    let r = server.conn().put("b", &[b'b'; 1000]);
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        r.text().contains("in flight") && r.text().contains("1500"),
        "{r:?}"
    );
    // Nor does a chunked one once it grows past what is left.
    let mut c = server.conn();
    let mut req =
        b"PUT /metadata?key=ch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..2 {
        req.extend_from_slice(b"12C\r\n");
        req.extend_from_slice(&[b'c'; 300]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    c.stream.write_all(&req).unwrap();
    let r = c.read_response(false);
    assert_eq!(r.status, 503, "{r:?}");
    // What fits is taken in meanwhile; others are served.
    assert_answer(&other.put("small", &[b's'; 400]), 200, "metadata updated");
    assert_answer(&other.get("small"), 200, &"s".repeat(400));
    // The held body completes; then its bytes are free again.
    held.stream.write_all(&[b'p'; 990]).unwrap();
    let r = held.read_response(false);
    assert_answer(&r, 200, "metadata updated");
    assert_answer(&other.put("b", &[b'b'; 1000]), 200, "metadata updated");
    // A body abandoned half way (the client goes away) frees its bytes.
    drop(put_partial(&server, "gone", 1000, 500));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = other.put("after", &[b'a'; 1000]);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{r:?}");
        assert!(Instant::now() < deadline, "budget not released");
        std::thread::sleep(Duration::from_millis(50));
        other = server.conn();
    }
    assert_eq!(other.get("after").body.len(), 1000);
    assert_answer(&other.get("gone"), 404, "metadata not found");
}

fn binary_serves_and_stops_on_sigterm() {
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
        .strip_prefix("mooncake-metadata-server listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let addr: SocketAddr = url.strip_suffix("/metadata").unwrap().parse().unwrap();
    assert!(addr.ip().is_loopback(), "binds 127.0.0.1 by default");
    let mut c = Conn::open(addr);
    assert_answer(&c.put("mooncake/ram/x", b"{}"), 200, "metadata updated");
    assert_answer(&c.get("mooncake/ram/x"), 200, "{}");
    // SIGTERM with a keep-alive connection open: a prompt, clean exit.
    let pid = child.id() as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut child, Duration::from_secs(5));
    assert_eq!(status.code(), Some(0));

    // Bad flags: usage error, exit 2.
    let out = Command::new(env!("CARGO_BIN_EXE_mooncake-metadata-server"))
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // Numbers out of range: exit 2, naming the flag (no panic).
    for (flag, bad) in [
        ("--idle-timeout-secs", "0"),
        ("--idle-timeout-secs", "18446744073709551615"),
        ("--request-timeout-secs", "99999999999"),
        ("--max-connections", "9223372036854775807"),
        ("--max-connections-per-ip", "0"),
        ("--max-inflight-body-bytes", "-5"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mooncake-metadata-server"))
            .args(["--port", "0", flag, bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {bad}: {err}");
        assert!(err.contains(flag), "{flag} {bad}: {err}");
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- upstream

const UPSTREAM_TEST: &str = "same_answers_as_upstream_python_server";

/// The Python with upstream's wheel and aiohttp, or why there is none.
fn upstream_server_python() -> Result<PathBuf, String> {
    let py = support::upstream_python().ok_or("upstream Mooncake not installed")?;
    let ok = Command::new(&py)
        .args(["-c", "import aiohttp, mooncake.http_metadata_server"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(py)
    } else {
        Err(format!(
            "{} cannot import mooncake.http_metadata_server (aiohttp missing?)",
            py.display()
        ))
    }
}

fn upstream_trial() -> Trial {
    match upstream_server_python() {
        Ok(py) => Trial::test(UPSTREAM_TEST, move || {
            same_answers_as_upstream(py);
            Ok(())
        }),
        Err(why) if std::env::var("MOONCAKE_REQUIRE_UPSTREAM").as_deref() == Ok("1") => {
            Trial::test(UPSTREAM_TEST, move || {
                Err(format!(
                    "{UPSTREAM_TEST}: upstream's metadata server is required but cannot run: \
                     {why}; run scripts/install-test-deps.sh (or set MOONCAKE_UPSTREAM_PYTHON)"
                )
                .into())
            })
        }
        Err(why) => {
            eprintln!(
                "skipped {UPSTREAM_TEST}: {why} (run scripts/install-test-deps.sh; the full \
                 test command does)"
            );
            Trial::test(UPSTREAM_TEST, || Ok(())).with_ignored_flag(true)
        }
    }
}

/// Upstream's Python server on a free port, killed on drop.
struct Upstream {
    child: Child,
    addr: SocketAddr,
}

impl Upstream {
    fn start(py: &PathBuf) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(py)
            .args(["-m", "mooncake.http_metadata_server", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--log-level", "WARNING"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut up = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(up.addr).is_err() {
            if let Some(s) = up.child.try_wait().unwrap() {
                panic!("upstream's metadata server exited: {s}");
            }
            assert!(
                Instant::now() < deadline,
                "upstream's metadata server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        up
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn same_answers_as_upstream(py: PathBuf) {
    let upstream = Upstream::start(&py);
    let ours = Server::start(Config::default());
    let seg = "127.0.0.1:15123";
    let rpc = format!("mooncake/rpc_meta/{seg}");
    let ram = format!("mooncake/ram/{seg}");
    let rpc_doc = br#"{"ip_or_host_name":"127.0.0.1","rpc_port":15123}"#.to_vec();
    let ram_doc = br#"{"name":"127.0.0.1:15123","protocol":"tcp","buffers":[]}"#.to_vec();
    let ram_doc2 =
        br#"{"name":"127.0.0.1:15123","protocol":"tcp","buffers":[{"addr":1}]}"#.to_vec();
    type Step = (&'static str, String, Option<Vec<u8>>);
    let mut steps: Vec<Step> = vec![
        // What an upstream engine sends over its life.
        ("PUT", target(&rpc), Some(rpc_doc.clone())),
        ("GET", target(&ram), None),
        ("PUT", target(&ram), Some(ram_doc)),
        ("PUT", target(&ram), Some(ram_doc2)),
        ("GET", target(&ram), None),
        ("GET", target(&rpc), None),
        // A restart under the same segment name.
        ("PUT", target(&rpc), Some(rpc_doc)),
        ("DELETE", target(&rpc), None),
        ("DELETE", target(&ram), None),
        ("DELETE", target(&ram), None),
        ("GET", "/metadata".into(), None),
        ("PUT", "/metadata".into(), Some(b"{}".to_vec())),
        ("DELETE", "/metadata?key=".into(), None),
    ];
    // And the corners: blank and padded keys, `+`, repeated and encoded
    // parameter names, malformed escapes, bodies that are not JSON, other
    // methods and paths.
    for (m, t, b) in [
        ("GET", "/metadata?key=%20%09", None),
        ("PUT", "/metadata?key=%20pad%09", Some(&b"not json"[..])),
        ("GET", "/metadata?key=pad", None),
        ("PUT", "/metadata?key=a+b", Some(b"")),
        ("GET", "/metadata?key=a%20b", None),
        ("GET", "/metadata?key=a%20b&key=zz", None),
        ("GET", "/metadata?k%65y=pad", None),
        ("PUT", "/metadata?key=%ZZ%2", Some(b"[1]")),
        ("GET", "/metadata?key=%25ZZ%252", None),
        ("PUT", "/metadata?key=%FF", Some(b"ff")),
        ("GET", "/metadata?key=%ff", None),
        ("GET", "/metadata?key=%EF%BF%BD", None),
        ("PUT", "/metadata?key=x%26y%3Dz%3F%2B%3A%2F", Some(b"w")),
        ("GET", "/metadata?key=x%26y%3Dz%3F%2B%3A%2F", None),
        ("PUT", "/metadata?key=mooncake%2Frpc_meta%2Fa", Some(b"1")),
        (
            "PUT",
            "/metadata?key=%20mooncake%2Frpc_meta%2Fa",
            Some(b"1"),
        ),
        ("POST", "/metadata?key=pad", Some(b"{}")),
        ("PATCH", "/metadata", None),
        ("OPTIONS", "/metadata?key=pad", None),
        ("GET", "/metadata/?key=pad", None),
        ("GET", "/%6Detadata?key=pad", None),
        ("GET", "/", None),
    ] {
        steps.push((m, t.to_string(), b.map(|b| b.to_vec())));
    }
    let mut a = Conn::open(upstream.addr);
    let mut b = ours.conn();
    let mut statuses = Vec::new();
    for (method, t, body) in &steps {
        let theirs = a.send(method, t, body.as_deref());
        let mine = b.send(method, t, body.as_deref());
        assert_eq!(mine, theirs, "{method} {t}: ours vs upstream's");
        statuses.push(mine.status);
    }
    // And the sequence went as expected (not merely the same).
    assert_eq!(
        &statuses[..13],
        &[200, 404, 200, 200, 200, 200, 400, 200, 200, 404, 400, 400, 400]
    );
    // The body cap: aiohttp's 1 MiB, the same answer over it (each on a
    // connection of its own: the server may close it).
    for (len, status) in [(1 << 20, 200), ((1 << 20) + 1, 413)] {
        let body = vec![b'x'; len];
        let theirs = Conn::open(upstream.addr).put("cap", &body);
        let mine = ours.conn().put("cap", &body);
        assert_eq!(mine, theirs, "PUT of {len} bytes: ours vs upstream's");
        assert_eq!(mine.status, status, "{mine:?}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `tests/interop/upstream_http_metadata.py` with these arguments.
fn upstream_engine_script(args: &[String]) -> Child {
    Command::new(support::upstream_python().expect("upstream python"))
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/interop/upstream_http_metadata.py"),
        )
        .args(args)
        .env("GLOG_minloglevel", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn script_output(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "upstream engine script failed ({}): {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Real upstream engines publish through our server and transfer; and an
/// engine restarting under the name of a crashed one (its rpc_meta key
/// left behind) fails by default, as with upstream's server, and starts
/// with --allow-rpc-meta-overwrite.
fn upstream_engines_through_our_server() {
    let url = |s: &Server| format!("http://{}/metadata", s.addr);
    let pair_server = Server::start(Config::default());
    let strict = Server::start(Config::default());
    let lenient = Server::start(Config {
        allow_rpc_meta_overwrite: true,
        ..Config::default()
    });
    // What a crashed engine leaves behind.
    let stale = free_port();
    let rpc = format!("mooncake/rpc_meta/127.0.0.1:{stale}");
    let old = format!(r#"{{"ip_or_host_name":"127.0.0.1","rpc_port":{stale}}}"#);
    for s in [&strict, &lenient] {
        assert_answer(&s.conn().put(&rpc, old.as_bytes()), 200, "metadata updated");
    }
    // The three run at once (each takes a second or two to start).
    let (port_a, port_b) = (free_port(), free_port());
    let pair = upstream_engine_script(&[
        "pair".into(),
        url(&pair_server),
        port_a.to_string(),
        port_b.to_string(),
    ]);
    let refused = upstream_engine_script(&[
        "init".into(),
        url(&strict),
        stale.to_string(),
        "clean".into(),
    ]);
    let allowed = upstream_engine_script(&[
        "init".into(),
        url(&lenient),
        stale.to_string(),
        "clean".into(),
    ]);
    assert_eq!(script_output(pair), "OK");
    assert_eq!(script_output(refused), "rc -1");
    assert_eq!(script_output(allowed), "rc 0");
    // Engines remove their keys when torn down; the refused one too, so
    // the stale key is gone and a second attempt would start.
    assert_answer(
        &pair_server.conn().get("mooncake/ram/127.0.0.1:1"),
        404,
        "metadata not found",
    );
    assert_answer(&strict.conn().get(&rpc), 404, "metadata not found");
    assert_answer(&lenient.conn().get(&rpc), 404, "metadata not found");
}
