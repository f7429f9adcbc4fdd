//! The examples as a user runs them: the binary `cargo test` builds,
//! started on a free loopback port and driven over real HTTP.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use super::free_port;

/// `target/debug/examples/<name>`, built by `cargo test` (or `cargo build
/// --examples` before a single test file is run).
pub fn example_binary(name: &str) -> PathBuf {
    // target/debug/deps/<test>-<hash> → target/debug/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} missing: run through `cargo test`, which builds examples",
        bin.display()
    );
    bin
}

/// An example server, killed when dropped.
pub struct Example {
    child: Child,
    /// What it printed after its banner, line by line (read by a thread
    /// that keeps the pipe open: a closed pipe would make the example's
    /// `println!` panic).
    lines: Receiver<String>,
    pub port: u16,
    /// The first line it printed.
    pub banner: String,
}

impl Example {
    /// Starts example `name` with `args` on a free port (`FLEETLIMIT_ADDR`),
    /// the environment's `REDIS_URL` and `FLEETLIMIT_CONFIG` removed and
    /// `env` set, and waits for its banner.
    ///
    /// A free port can be taken by another test between `free_port` and
    /// the example's bind: an example that exits before its banner is
    /// started again on another port, three times at most.
    pub fn start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        for _ in 0..2 {
            if let Some(ex) = Self::try_start(name, args, env) {
                return ex;
            }
        }
        Self::try_start(name, args, env)
            .unwrap_or_else(|| panic!("example {name} exited before serving, three times"))
    }

    fn try_start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Option<Self> {
        let port = free_port();
        let mut cmd = Command::new(example_binary(name));
        cmd.args(args)
            .env("FLEETLIMIT_ADDR", format!("127.0.0.1:{port}"))
            .env_remove("REDIS_URL")
            .env_remove("FLEETLIMIT_CONFIG")
            .env("RUST_LOG", "off")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let mut banner = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut banner).unwrap();
        if banner.is_empty() {
            let _ = child.wait();
            return None;
        }
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Some(Self {
            child,
            lines,
            port,
            banner,
        })
    }

    /// The process id (to send it signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line it prints that starts with `prefix`, waiting up to
    /// `timeout`; panics when none comes.
    pub fn line_starting(&self, prefix: &str, timeout: Duration) -> String {
        self.next_line(
            |l| l.starts_with(prefix),
            &format!("starting {prefix:?}"),
            timeout,
        )
    }

    /// The next line it prints that contains `part`, waiting up to
    /// `timeout`; panics when none comes.
    pub fn line_containing(&self, part: &str, timeout: Duration) -> String {
        self.next_line(
            |l| l.contains(part),
            &format!("containing {part:?}"),
            timeout,
        )
    }

    fn next_line(&self, wanted: impl Fn(&str) -> bool, what: &str, timeout: Duration) -> String {
        let until = std::time::Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if wanted(&line) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line {what} within {timeout:?}: {e}"),
            }
        }
    }

    /// One HTTP/1.1 request; returns (status, lower-cased raw response).
    pub fn http(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: 0\r\n"
        );
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

    /// The statuses of `n` identical requests.
    pub fn statuses(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        n: usize,
    ) -> Vec<u16> {
        (0..n).map(|_| self.http(method, path, headers).0).collect()
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
