//! `rediss://` against a TLS `redis-server` started here, with a CA and a
//! server certificate made by the test: checks are decided by Redis over
//! TLS; a certificate from another CA, or a plaintext port, never carries a
//! check (the route's policy answers) and nothing falls back to plaintext.
//! Built without the `tls` feature, a `rediss://` URL is a configuration
//! error instead.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]
#![cfg_attr(not(feature = "tls"), allow(dead_code, unused_imports))]

use crate::support;

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use support::*;

const LIMITS: &str = r#"[limits.per-key]
key = "header:x-api-key"
capacity = 3
refill = "1/min"

[[routes]]
path = "/"
limits = ["per-key"]
on_redis_error = "closed"
"#;

/// A self-signed CA: its certificate (PEM) and its signing parts.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// Writes the CA's certificate to `dir/name`.
    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }

    /// A certificate for `names` signed by this CA: `dir/stem.pem` and its
    /// key `dir/stem.key`.
    fn issue(&self, names: &[&str], dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, stem);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }
}

/// A Redis serving TLS on `tls_port` (and plaintext on `server.port`, which
/// the test's own `redis-cli` uses), its certificate for 127.0.0.1 signed by
/// `ca`; the CA file is `ca.pem` in `dir`. `auth_clients`: Redis'
/// `tls-auth-clients` (`no`, or `yes` to require a client certificate).
struct TlsRedis {
    server: RedisServer,
    tls_port: u16,
    dir: PathBuf,
}

impl TlsRedis {
    fn start(ca: &Ca, auth_clients: &str) -> Self {
        let tls_port = free_port();
        let dir =
            std::env::temp_dir().join(format!("fleetlimit-tls-{tls_port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        ca.issue(&["127.0.0.1"], &dir, "server");
        let ca_file = ca.write(&dir, "ca.pem");
        let file = |n: &str| dir.join(n).to_str().unwrap().to_owned();
        let server = RedisServer::start_with(
            &[
                "--tls-port",
                &tls_port.to_string(),
                "--tls-cert-file",
                &file("server.pem"),
                "--tls-key-file",
                &file("server.key"),
                "--tls-ca-cert-file",
                ca_file.to_str().unwrap(),
                "--tls-auth-clients",
                auth_clients,
            ],
            &[],
        );
        Self {
            server,
            tls_port,
            dir,
        }
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A configuration on `url` trusting `ca_file` (none: the system's roots
/// only), written to a file for the CLI too.
fn config(
    url: &str,
    ca_file: Option<&Path>,
    prefix: &str,
    more: &str,
) -> (fleetlimit::Config, PathBuf) {
    let ca = ca_file.map_or_else(String::new, |f| {
        format!("tls_ca_file = \"{}\"\n", f.display())
    });
    let src = format!(
        "[redis]\nurl = \"{url}\"\n{ca}{more}key_prefix = \"{prefix}\"\ndeadline = \"500ms\"\nconnect_timeout = \"1s\"\n\n{LIMITS}"
    );
    let dir = std::env::temp_dir().join(format!("fleetlimit-tls-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{prefix}.toml"));
    std::fs::write(&path, &src).unwrap();
    let cfg = fleetlimit::Config::from_toml_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    (cfg, path)
}

/// The command's exit code and everything it printed.
fn cli(args: &[&str]) -> (i32, String) {
    let (code, out, err) = run_cli(args, &[]);
    (code, out + &err)
}

fn req() -> http::Request<axum::body::Body> {
    request("GET", "/", "127.0.0.1:1", &[("x-api-key", "caller")])
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "current_thread")]
async fn rediss_with_the_ca_file_is_decided_by_redis() {
    let ca = Ca::new("fleetlimit test CA");
    let redis = TlsRedis::start(&ca, "no");
    let prefix = prefix("tls-ok");
    let ca_file = redis.dir.join("ca.pem");
    let (cfg, path) = config(&redis.url(), Some(&ca_file), &prefix, "");
    assert!(cfg.describe().contains("TLS CA file"), "{}", cfg.describe());
    let (app, logs) = logged(ok_app(cfg)).await;
    assert!(!logs.contains("WARN"), "{logs}");
    for left in (0..3).rev() {
        let res = send(&app, req()).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), left);
    }
    assert_eq!(send(&app, req()).await.status(), 429);
    redis.server.assert_every_key_expires(&prefix);

    // The reset listener connects like the pool (TLS, the CA file): it is
    // subscribed once the layer is built.
    let channel = format!("{prefix}:reset");
    let numsub = redis.server.cli(&["PUBSUB", "NUMSUB", &channel]).unwrap();
    assert_eq!(numsub.lines().nth(1).map(str::trim), Some("1"), "{numsub}");

    // The CLI connects the same way.
    let (code, out) = cli(&["inspect", "caller", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("{prefix}:per-key:")), "{out}");
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "current_thread")]
async fn a_certificate_of_another_ca_is_refused() {
    let ca = Ca::new("fleetlimit test CA");
    let redis = TlsRedis::start(&ca, "no");
    let prefix = prefix("tls-wrong-ca");
    let other = Ca::new("some other CA").write(&redis.dir, "other.pem");
    let (cfg, path) = config(&redis.url(), Some(&other), &prefix, "");
    let (app, logs) = logged(ok_app(cfg)).await;
    assert!(logs.contains("Redis not reachable at start"), "{logs}");
    assert!(logs.contains("certificate"), "{logs}");
    // The closed route's policy answers; Redis never sees a check.
    for _ in 0..3 {
        assert_eq!(send(&app, req()).await.status(), 503);
    }
    assert!(redis.server.keys_with_pttl(&prefix).is_empty());

    let (code, out) = cli(&["inspect", "caller", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("certificate"), "{out}");
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "current_thread")]
async fn a_client_certificate_when_redis_asks_for_one() {
    let ca = Ca::new("fleetlimit test CA");
    let redis = TlsRedis::start(&ca, "yes");
    let ca_file = redis.dir.join("ca.pem");

    // Without one, Redis ends the handshake: the route's policy answers.
    let refused = prefix("tls-no-client-cert");
    let (cfg, _) = config(&redis.url(), Some(&ca_file), &refused, "");
    let (app, logs) = logged(ok_app(cfg)).await;
    assert_eq!(send(&app, req()).await.status(), 503);
    assert_eq!(redis.server.keys_with_pttl(&refused), vec![]);
    assert!(logs.contains("Redis not reachable at start"), "{logs}");

    let (cert, key) = ca.issue(&[], &redis.dir, "client");
    let prefix = prefix("tls-client-cert");
    let client = format!(
        "tls_client_cert = \"{}\"\ntls_client_key = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let (cfg, _) = config(&redis.url(), Some(&ca_file), &prefix, &client);
    assert!(
        cfg.describe().contains("TLS client certificate"),
        "{}",
        cfg.describe()
    );
    let (app, logs) = logged(ok_app(cfg)).await;
    assert!(!logs.contains("WARN"), "{logs}");
    for left in (0..3).rev() {
        let res = send(&app, req()).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header_u64(&res, "x-ratelimit-remaining"), left);
    }
    assert_eq!(send(&app, req()).await.status(), 429);
    redis.server.assert_every_key_expires(&prefix);
}

/// The bug this guards against: `rediss://` used to connect in plaintext
/// (fred without TLS only warns) and serve 200s, writing keys.
#[tokio::test(flavor = "current_thread")]
async fn rediss_to_a_plaintext_port_never_writes_keys() {
    let server = RedisServer::start();
    let prefix = prefix("tls-plain");
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let src = format!(
        "[redis]\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\ndeadline = \"500ms\"\nconnect_timeout = \"1s\"\n\n{LIMITS}"
    );
    let cfg = match fleetlimit::Config::from_toml_str(&src) {
        Ok(cfg) => cfg,
        Err(e) => {
            // A build without TLS refuses the URL at start, with its place.
            if cfg!(feature = "tls") {
                panic!("a TLS build refused a rediss:// URL: {e}");
            }
            assert_eq!(e.line(), Some(2), "{e}");
            assert!(e.message().contains("no TLS support"), "{e}");
            return;
        }
    };
    let (app, logs) = logged(ok_app(cfg)).await;
    for _ in 0..3 {
        assert_eq!(send(&app, req()).await.status(), 503);
    }
    assert_eq!(server.keys_with_pttl(&prefix), vec![]);
    assert_eq!(server.script_calls(), 0);
    assert!(logs.contains("Redis not reachable at start"), "{logs}");
    assert!(logs.contains("serve TLS?"), "{logs}");
}
