//! `examples/login.rs` keeps working: the example binary that `cargo test`
//! builds, driven over real HTTP with its bundled `examples/login.toml`.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{free_port, RedisServer};

fn example_binary() -> PathBuf {
    // target/debug/deps/login_example-<hash> → target/debug/examples/login
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("examples").join("login");
    assert!(
        bin.exists(),
        "{} missing: run through `cargo test`, which builds examples",
        bin.display()
    );
    bin
}

struct Example {
    child: Child,
    /// Kept open: a closed pipe would make the example's `println!` panic.
    _stdout: BufReader<std::process::ChildStdout>,
    port: u16,
    banner: String,
}

impl Example {
    fn start(redis_url: Option<&str>, config: Option<&std::path::Path>) -> Self {
        let port = free_port();
        let mut cmd = Command::new(example_binary());
        cmd.env("FLEETLIMIT_ADDR", format!("127.0.0.1:{port}"))
            .env_remove("REDIS_URL")
            .env("RUST_LOG", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(url) = redis_url {
            cmd.env("REDIS_URL", url);
        }
        if let Some(path) = config {
            cmd.arg(path);
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

    /// `POST /login`; returns (status, lower-cased raw response).
    fn login(&self, headers: &[(&str, &str)]) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req =
            "POST /login HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: 0\r\n"
                .to_owned();
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, out.to_ascii_lowercase())
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ALICE: [(&str, &str); 2] = [("x-account", "alice"), ("x-password", "correct-horse")];
const GUESS: [(&str, &str); 2] = [("x-account", "alice"), ("x-password", "hunter2")];
const CHALLENGE: &str = "urn:fleetlimit:challenge-required";

/// With Redis: a success is not counted; one address guessing alice's
/// password is refused after 5 failures (per IP+account), and that address
/// then cannot sign in as alice either.
#[test]
fn login_example_refuses_one_address_guessing_one_account() {
    let server = RedisServer::start();
    let ex = Example::start(Some(&server.url()), None);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    for _ in 0..3 {
        let (status, raw) = ex.login(&ALICE);
        assert_eq!(status, 200, "{raw}");
        assert!(raw.contains("welcome, alice"), "{raw}");
    }
    let guesses: Vec<u16> = (0..6).map(|_| ex.login(&GUESS).0).collect();
    assert_eq!(guesses, [401, 401, 401, 401, 401, 429]);
    let (status, raw) = ex.login(&ALICE);
    assert_eq!(status, 429, "{raw}");
    assert!(raw.contains("per-ip-account"), "{raw}");
    server.assert_every_key_expires("rl");
}

/// In-process, behind a (local) proxy so each request can name its client
/// address: guesses from two addresses spend alice's per-account budget
/// (10), after which alice herself is challenged — never refused — and
/// signs in once the challenge is solved.
#[test]
fn login_example_challenges_the_owner_instead_of_locking_her_out() {
    let dir = std::env::temp_dir().join(format!("fleetlimit-login-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("login.toml");
    let bundled =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/login.toml"))
            .unwrap();
    let proxied = format!("{bundled}\n[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\"]\n");
    std::fs::write(&path, proxied).unwrap();
    let ex = Example::start(None, Some(&path));
    assert!(ex.banner.contains("in-process store"), "{}", ex.banner);
    let from = |ip: &'static str, h: &[(&'static str, &'static str)]| {
        let mut h = h.to_vec();
        h.push(("x-forwarded-for", ip));
        h
    };
    for ip in ["198.51.100.1", "198.51.100.2"] {
        for _ in 0..5 {
            let (status, raw) = ex.login(&from(ip, &GUESS));
            assert_eq!(status, 401, "{raw}");
            assert!(!raw.contains(CHALLENGE), "{raw}");
        }
    }
    let (status, raw) = ex.login(&from("198.51.100.3", &GUESS));
    assert_eq!(status, 401, "{raw}");
    assert!(raw.contains(CHALLENGE), "{raw}");
    let (status, raw) = ex.login(&from("203.0.113.5", &ALICE));
    assert_eq!(status, 401, "the owner is challenged, not refused: {raw}");
    assert!(
        raw.contains(CHALLENGE) && raw.contains("per-account"),
        "{raw}"
    );
    let mut solved = from("203.0.113.5", &ALICE);
    solved.push(("x-captcha", "solved"));
    let (status, raw) = ex.login(&solved);
    assert_eq!(status, 200, "{raw}");
    assert!(raw.contains("welcome, alice"), "{raw}");
    let _ = std::fs::remove_dir_all(&dir);
}
