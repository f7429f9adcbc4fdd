//! Redis: our own server, a minimal RESP client, `INFO commandstats`.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener as StdTcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of our own, killed (and its directory removed) when
/// dropped, also while unwinding from a panic.
pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    pub child: Child,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With more `redis-server` arguments (a Cluster node's).
    pub fn start_with(extra: &[&str]) -> Self {
        let port = StdTcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "fleetlimit-load-redis-{port}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        // As the tests: `FLEETLIMIT_REDIS_SERVER` (e.g. valkey-server), else
        // redis-server.
        let bin =
            std::env::var("FLEETLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let child = Command::new(&bin)
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{bin} must be on PATH (apt-get install redis-server): {e}")
            });
        let server = Self { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Reply::Simple(s)) = server.cmd(&["PING"]) {
                if s == "PONG" {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One command on a fresh connection (never used while frozen).
    pub fn cmd(&self, args: &[&str]) -> std::io::Result<Reply> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            let _ = write!(out, "${}\r\n{a}\r\n", a.len());
        }
        (&stream).write_all(out.as_bytes())?;
        read_reply(&mut BufReader::new(&stream))
    }

    pub fn must(&self, args: &[&str]) -> Reply {
        match self.cmd(args) {
            Ok(Reply::Error(e)) => panic!("redis {args:?}: {e}"),
            Ok(r) => r,
            Err(e) => panic!("redis {args:?}: {e}"),
        }
    }

    pub fn flushall(&self) {
        self.must(&["FLUSHALL"]);
    }

    pub fn reset_stats(&self) {
        self.must(&["CONFIG", "RESETSTAT"]);
    }

    pub fn commandstats(&self) -> String {
        match self.must(&["INFO", "commandstats"]) {
            Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
            r => panic!("INFO answered {r:?}"),
        }
    }

    /// `cmdstat_evalsha` + `cmdstat_eval` calls and their µs since the
    /// last reset.
    pub fn script_stats(&self) -> (u64, u64) {
        let stats = self.commandstats();
        ["evalsha", "eval"]
            .iter()
            .filter_map(|c| cmdstat(&stats, c))
            .fold((0, 0), |(calls, usec), s| (calls + s.calls, usec + s.usec))
    }

    /// SIGSTOP until the guard is dropped.
    pub fn freeze(&self) -> Frozen {
        signal(self.pid(), "STOP");
        Frozen(self.pid())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        signal(self.pid(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Redis is SIGSTOPped while this lives.
pub struct Frozen(u32);

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("load harness: kill -{sig} {pid} failed");
    }
}

/// A RESP reply, parsed in full (not every kind is looked at).
#[derive(Debug)]
#[allow(dead_code)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

pub fn read_reply(r: &mut impl BufRead) -> std::io::Result<Reply> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad("empty reply"))?;
    let len = || rest.parse::<i64>().map_err(|_| bad("bad length"));
    Ok(match kind {
        "+" => Reply::Simple(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(len()?),
        "$" => match len()? {
            n if n < 0 => Reply::Nil,
            n => {
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Reply::Bulk(buf)
            }
        },
        "*" => match len()? {
            n if n < 0 => Reply::Nil,
            n => Reply::Array((0..n).map(|_| read_reply(r)).collect::<Result<_, _>>()?),
        },
        _ => return Err(bad("unknown reply type")),
    })
}

#[derive(Clone, Copy, Debug)]
pub struct CmdStat {
    pub calls: u64,
    pub usec: u64,
    pub failed: u64,
}

/// `cmdstat_<name>:calls=..,usec=..,...` from `INFO commandstats`.
pub fn cmdstat(info: &str, name: &str) -> Option<CmdStat> {
    let prefix = format!("cmdstat_{name}:");
    let fields = info.lines().find_map(|l| l.strip_prefix(&prefix))?;
    let field = |f: &str| -> u64 {
        fields
            .split(',')
            .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(CmdStat {
        calls: field("calls"),
        usec: field("usec"),
        failed: field("failed_calls") + field("rejected_calls"),
    })
}
