//! Real metadata stores for integration tests: etcd members and
//! redis-server started on free 127.0.0.1 ports with their data in a
//! temporary directory, stopped by PID when dropped; readers that look at
//! the keys the way a human would (etcd's JSON gateway, raw RESP).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;

/// The path of `name` on $PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether CI demands the servers (a missing binary then fails the test).
pub fn servers_required() -> bool {
    std::env::var("MC_REQUIRE_METADATA_SERVERS").as_deref() == Ok("1")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A temporary directory removed on drop.
pub struct TmpDir(PathBuf);

impl TmpDir {
    pub fn new(tag: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("mc-{tag}-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// One HTTP/1.1 request on a new connection; (status, body).
pub fn http(port: u16, method: &str, target: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\
         Content-Type: application/json\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .ok()?;
    s.write_all(body).ok()?;
    let mut all = Vec::new();
    s.read_to_end(&mut all).ok()?;
    let head_end = all.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&all[..head_end]).to_string();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut body = all[head_end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Some((status, body))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
    out
}

pub struct EtcdMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    child: Option<Child>,
}

impl EtcdMember {
    fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        }
    }
    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
    fn start(&mut self, bin: &Path, dir: &Path, cluster: &str) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let log = std::fs::File::create(dir.join(format!("{}.log", self.name))).unwrap();
        let child = Command::new(bin)
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(dir.join(&self.name))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", cluster])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting etcd");
        self.child = Some(child);
    }
    fn healthy(&self) -> bool {
        matches!(http(self.client_port, "GET", "/health", b""), Some((200, b)) if String::from_utf8_lossy(&b).contains("true"))
    }
    /// SIGKILL: a member that crashed.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An etcd cluster of `n` members on loopback.
pub struct Etcd {
    pub members: Vec<EtcdMember>,
    _dir: TmpDir,
}

impl Etcd {
    /// None when etcd is not installed (and not required).
    pub fn start(n: usize) -> Option<Self> {
        let Some(bin) = which("etcd") else {
            assert!(
                !servers_required(),
                "etcd is required (MC_REQUIRE_METADATA_SERVERS=1) but not installed"
            );
            return None;
        };
        let dir = TmpDir::new("etcd");
        let mut members: Vec<EtcdMember> =
            (0..n).map(|i| EtcdMember::new(&format!("m{i}"))).collect();
        let cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        for m in &mut members {
            m.start(&bin, dir.path(), &cluster);
        }
        for m in &members {
            assert!(
                wait_until(Duration::from_secs(30), || m.healthy()),
                "etcd member {} did not become healthy (log in {})",
                m.name,
                dir.path().display()
            );
        }
        Some(Self { members, _dir: dir })
    }
    /// `etcd://a,b,c`
    pub fn conn(&self) -> String {
        format!(
            "etcd://{}",
            self.members
                .iter()
                .map(EtcdMember::endpoint)
                .collect::<Vec<_>>()
                .join(",")
        )
    }
    /// The value under `key` read through a live member's JSON gateway.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = format!("{{\"key\":\"{}\"}}", b64.encode(key));
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            if let Some((200, resp)) = http(m.client_port, "POST", "/v3/kv/range", body.as_bytes())
            {
                let v: serde_json::Value = serde_json::from_slice(&resp).ok()?;
                let value = v["kvs"].get(0)?["value"].as_str()?;
                return b64.decode(value).ok();
            }
        }
        None
    }
}

pub struct Redis {
    pub port: u16,
    pub password: String,
    child: Child,
    _dir: TmpDir,
}

impl Redis {
    pub fn start(password: &str) -> Option<Self> {
        let Some(bin) = which("redis-server") else {
            assert!(
                !servers_required(),
                "redis-server is required (MC_REQUIRE_METADATA_SERVERS=1) but not installed"
            );
            return None;
        };
        let dir = TmpDir::new("redis");
        let port = free_port();
        let child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .args(["--requirepass", password])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server");
        let r = Self {
            port,
            password: password.into(),
            child,
            _dir: dir,
        };
        assert!(
            wait_until(Duration::from_secs(15), || r.command(&["PING"]).is_some()),
            "redis-server did not answer"
        );
        Some(r)
    }
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
    /// One command after AUTH; the first reply line and, for a bulk
    /// string, its bytes.
    pub fn command(&self, args: &[&str]) -> Option<(String, Option<Vec<u8>>)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut msg = Vec::new();
        for cmd in [vec!["AUTH", self.password.as_str()], args.to_vec()] {
            msg.extend_from_slice(format!("*{}\r\n", cmd.len()).as_bytes());
            for a in cmd {
                msg.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
            }
        }
        s.write_all(&msg).ok()?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).ok()?; // +OK of AUTH
        if !line.starts_with("+OK") {
            return None;
        }
        line.clear();
        r.read_line(&mut line).ok()?;
        let line = line.trim_end().to_string();
        if let Some(n) = line.strip_prefix('$') {
            let n: i64 = n.parse().ok()?;
            if n < 0 {
                return Some((line, None));
            }
            let mut b = vec![0u8; n as usize + 2];
            r.read_exact(&mut b).ok()?;
            b.truncate(n as usize);
            return Some((line, Some(b)));
        }
        Some((line, None))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
