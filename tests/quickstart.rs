//! The README's promise: `cargo run --example quickstart` serves the three
//! routes on a bare machine, and uses Redis when `REDIS_URL` is set.
//! Runs the example binary that `cargo test` builds, over real HTTP.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{free_port, RedisServer};

fn example_binary() -> PathBuf {
    // target/debug/deps/quickstart-<hash> → target/debug/examples/quickstart
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("examples").join("quickstart");
    assert!(
        bin.exists(),
        "{} missing: run through `cargo test`, which builds examples",
        bin.display()
    );
    bin
}

struct Example {
    child: Child,
    /// Kept open: the example prints more lines, and a closed pipe would
    /// make its `println!` panic.
    _stdout: BufReader<std::process::ChildStdout>,
    port: u16,
    banner: String,
}

impl Example {
    fn start(redis_url: Option<&str>) -> Self {
        let port = free_port();
        let mut cmd = Command::new(example_binary());
        cmd.env("FLEETLIMIT_ADDR", format!("127.0.0.1:{port}"))
            .env_remove("REDIS_URL")
            .env_remove("FLEETLIMIT_CONFIG")
            .env("RUST_LOG", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(url) = redis_url {
            cmd.env("REDIS_URL", url);
        }
        let mut child = cmd.spawn().unwrap();
        let mut banner = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut banner).unwrap();
        Self {
            child,
            _stdout: stdout,
            port,
            banner,
        }
    }

    /// One HTTP/1.1 request; returns (status, raw response).
    fn http(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: 0\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out)
            .unwrap_or_else(|e| panic!("{method} {path} {headers:?}: {e}; read {out:?}"));
        let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, out.to_ascii_lowercase())
    }

    fn statuses(&self, method: &str, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
        (0..n).map(|_| self.http(method, path, headers).0).collect()
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn exercise(ex: &Example, tag: &str) {
    let key = format!("key-{tag}");
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", &key)], 6),
        [200, 200, 200, 200, 200, 429]
    );
    let (_, raw) = ex.http("GET", "/", &[("x-api-key", &key)]);
    assert!(raw.contains("retry-after: 1"), "{raw}");
    let acct = format!("acct-{tag}");
    assert_eq!(
        ex.statuses("POST", "/sign-in", &[("x-account", &acct)], 4),
        [200, 200, 200, 429]
    );
    assert_eq!(ex.http("POST", "/sign-in", &[]).0, 401, "no account");
    let search = format!("search-{tag}");
    assert_eq!(
        ex.statuses("GET", "/search", &[("x-api-key", &search)], 3),
        [200, 200, 429],
        "cost 2 of 5"
    );
}

#[test]
fn quickstart_runs_without_redis() {
    let ex = Example::start(None);
    assert!(
        ex.banner.contains("using the in-process store"),
        "{}",
        ex.banner
    );
    exercise(&ex, "memory");
}

#[test]
fn quickstart_uses_redis_when_redis_url_is_set() {
    let server = RedisServer::start();
    let ex = Example::start(Some(&server.url()));
    assert!(
        ex.banner
            .contains(&format!("using Redis at {}", server.url())),
        "{}",
        ex.banner
    );
    exercise(&ex, "redis");
    let keys = server.keys_with_pttl("rl");
    assert_eq!(keys.len(), 3, "{keys:?}");
    server.assert_every_key_expires("rl");
}
