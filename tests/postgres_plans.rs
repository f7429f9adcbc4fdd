//! Plans from PostgreSQL (feature `postgres`): against a PostgreSQL server
//! this test binary starts itself (a temporary cluster made by `initdb` on a
//! free loopback port, as the Redis tests start their own redis-server), or
//! the one at `DATABASE_URL` when that is set, and redis-server processes of
//! the tests' own. Each test makes its own table and drops it.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use fleetlimit::RateLimitLayer;
use fleetlimit::plan::PostgresPlans;
use support::*;

/// Base 5; `basic` 10; `pro` 50 — a header says which numbers applied.
const LIMITS: &str = r#"
[limits.api]
key = "header:x-api-key"
algorithm = "fixed-window"
limit = 5
window = "60s"

[plans.basic.api]
limit = 10

[plans.pro.api]
limit = 50

[plan_cache]
ttl = "300ms"

[[routes]]
path = "/"
limits = ["api"]
on_redis_error = "closed"
"#;
const TTL: Duration = Duration::from_millis(300);
const LOOKUP_TIMEOUT: Duration = Duration::from_millis(200);

fn database_url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return url;
    }
    static SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SERVER.get_or_init(start_postgres).clone()
}

/// The directory of `initdb` and `postgres`: `FLEETLIMIT_PG_BINDIR`, else
/// the newest of Debian's `/usr/lib/postgresql/<version>/bin`, else `PATH`.
fn pg_bindir() -> std::path::PathBuf {
    if let Ok(dir) = std::env::var("FLEETLIMIT_PG_BINDIR") {
        return dir.into();
    }
    let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_default()
}

/// The uid and gid `postgres` runs as: PostgreSQL refuses to run as root,
/// so as root (CI) the server runs as the `postgres` user that Debian's
/// package creates.
fn pg_user() -> Option<(u32, u32)> {
    let me = std::process::Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("id postgres");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("running as root needs a `postgres` user to run the test server as")
    };
    Some((id("-u"), id("-g")))
}

/// Starts a PostgreSQL of this process's own: `initdb` into a fresh
/// directory (trust auth), `postgres` on a free loopback port with its
/// socket in that directory. A shell watches this process's end: when the
/// pipe it reads closes (the test binary exited, however), it stops the
/// server and removes the directory, so nothing is left behind.
fn start_postgres() -> String {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let bin = pg_bindir();
    let dir = std::env::temp_dir().join(format!("fleetlimit-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let user = pg_user();
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    }
    let as_user = |cmd: &mut Command| {
        if let Some((uid, gid)) = user {
            cmd.uid(uid).gid(gid);
        }
    };
    let data = dir.join("data");
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
            "-D",
        ])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    as_user(&mut initdb);
    let out = initdb.output().unwrap_or_else(|e| {
        panic!(
            "initdb in {}: {e} (install PostgreSQL: apt-get install postgresql, \
             or set DATABASE_URL to a server of your own)",
            bin.display()
        )
    });
    assert!(
        out.status.success(),
        "initdb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = support::free_port();
    let postgres = bin.join("postgres");
    let script = format!(
        "'{}' -D '{}' -p {port} -k '{}' -c listen_addresses=127.0.0.1 -c fsync=off \
         >'{}/log' 2>&1 & pid=$!; read _; kill -INT $pid; wait $pid; rm -rf '{}'",
        postgres.display(),
        data.display(),
        dir.display(),
        dir.display(),
        dir.display(),
    );
    let mut watch = Command::new("sh");
    watch.args(["-c", &script]).stdin(Stdio::piped());
    as_user(&mut watch);
    let child = watch.spawn().expect("sh");
    // The pipe's write end stays open for the life of this process.
    std::mem::forget(child);
    let base = format!("postgres://postgres@127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "PostgreSQL did not start: {}",
            std::fs::read_to_string(dir.join("log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut createdb = Command::new(bin.join("createdb"));
    createdb.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "postgres",
        "test",
    ]);
    assert!(
        createdb.status().expect("createdb").success(),
        "createdb test"
    );
    format!("{base}/test")
}

async fn pg() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {}: {e}", database_url()));
    tokio::spawn(conn);
    client
}

/// A plans table of this test's own, dropped at the end (also when the
/// test fails).
struct Table {
    name: String,
    client: tokio_postgres::Client,
}

impl Table {
    async fn create(test: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "fleetlimit_plans_{test}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let client = pg().await;
        client
            .batch_execute(&format!(
                "CREATE TABLE {name} (subject text PRIMARY KEY, plan text NOT NULL)"
            ))
            .await
            .unwrap();
        Self { name, client }
    }

    async fn set(&self, subject: &str, plan: &str) {
        self.client
            .execute(
                &format!(
                    "INSERT INTO {} (subject, plan) VALUES ($1, $2) \
                     ON CONFLICT (subject) DO UPDATE SET plan = EXCLUDED.plan",
                    self.name
                ),
                &[&subject, &plan],
            )
            .await
            .unwrap();
    }

    fn resolver(&self) -> PostgresPlans {
        PostgresPlans::connect(&database_url())
            .unwrap()
            .table(&self.name)
            .unwrap()
            .lookup_timeout(LOOKUP_TIMEOUT)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop can't await: a thread with a runtime of its own.
        let done = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    pg().await
                        .batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
                        .await
                })
        })
        .join();
        if !matches!(done, Ok(Ok(()))) && !std::thread::panicking() {
            panic!("dropping table {}: {done:?}", self.name);
        }
    }
}

async fn instance(server: &RedisServer, prefix: &str, plans: PostgresPlans) -> Router {
    let cfg = redis_config(server, prefix, "500ms", LIMITS);
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(cfg).plan_resolver(plans).await.unwrap())
}

async fn hit(app: &Router, key: &str) -> axum::http::Response<axum::body::Body> {
    send(
        app,
        request("GET", "/", "127.0.0.1:1", &[("x-api-key", key)]),
    )
    .await
}

/// The limit a response says applied (status must be 200 or 429).
async fn limit_seen(app: &Router, key: &str) -> u64 {
    let res = hit(app, key).await;
    let s = res.status().as_u16();
    assert!(s == 200 || s == 429, "{s}");
    header_u64(&res, "x-ratelimit-limit")
}

#[tokio::test]
async fn plans_from_the_table_apply_on_every_instance() {
    let server = RedisServer::start();
    let prefix = prefix("pg-apply");
    let table = Table::create("apply").await;
    table.set("pro-key", "pro").await;
    table.set("basic-key", "basic").await;
    let a = instance(&server, &prefix, table.resolver()).await;
    let b = instance(&server, &prefix, table.resolver()).await;

    // 70 requests of a pro key, alternating instances: 50 admitted in all.
    let mut admitted = 0;
    for i in 0..70 {
        let app = if i % 2 == 0 { &a } else { &b };
        let res = hit(app, "pro-key").await;
        assert_eq!(header_u64(&res, "x-ratelimit-limit"), 50);
        admitted += usize::from(res.status() == 200);
    }
    assert_eq!(admitted, 50);
    assert_eq!(limit_seen(&a, "basic-key").await, 10);
    assert_eq!(limit_seen(&b, "basic-key").await, 10);
    assert_eq!(limit_seen(&a, "no-row").await, 5, "no row: base numbers");
    assert_eq!(limit_seen(&b, "no-row").await, 5);
    server.assert_every_key_expires(&prefix);
}

#[tokio::test]
async fn an_upgrade_reaches_both_instances_within_the_ttl() {
    let server = RedisServer::start();
    let prefix = prefix("pg-upgrade");
    let table = Table::create("upgrade").await;
    table.set("k", "basic").await;
    let a = instance(&server, &prefix, table.resolver()).await;
    let b = instance(&server, &prefix, table.resolver()).await;
    assert_eq!(limit_seen(&a, "k").await, 10);
    assert_eq!(limit_seen(&b, "k").await, 10);

    table.set("k", "pro").await;
    // Each instance's answer went stale at most a TTL after the update
    // (its lookup was before it); the next request looks up again.
    tokio::time::sleep(TTL).await;
    assert_eq!(limit_seen(&a, "k").await, 50);
    assert_eq!(limit_seen(&b, "k").await, 50);

    // And a downgrade the same way.
    table.set("k", "basic").await;
    tokio::time::sleep(TTL).await;
    assert_eq!(limit_seen(&a, "k").await, 10);
    assert_eq!(limit_seen(&b, "k").await, 10);
}

#[tokio::test]
async fn postgres_unreachable_gives_the_base_numbers_and_is_logged() {
    let server = RedisServer::start();
    let prefix = prefix("pg-down");
    // Nothing listens on this port.
    let url = format!("postgres://postgres@127.0.0.1:{}/test", free_port());
    let plans = PostgresPlans::connect(&url)
        .unwrap()
        .lookup_timeout(LOOKUP_TIMEOUT);
    let app = instance(&server, &prefix, plans).await;
    let start = Instant::now();
    let (statuses, logs) = logged(async {
        let mut statuses = Vec::new();
        for i in 0..7 {
            let res = hit(&app, "pro-key").await;
            assert_eq!(header_u64(&res, "x-ratelimit-limit"), 5, "request {i}");
            statuses.push(res.status().as_u16());
        }
        statuses
    })
    .await;
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert!(logs.contains("plan lookup in PostgreSQL failed"), "{logs}");
    // Cached for the TTL, and throttled: a line a second at most, not one
    // per request.
    let lines = logs.matches("plan lookup in PostgreSQL failed").count();
    assert!(
        lines as u64 <= 1 + start.elapsed().as_secs(),
        "{lines} lines in {:?}: {logs}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_blocked_lookup_is_cut_off_by_the_timeout() {
    let server = RedisServer::start();
    let prefix = prefix("pg-slow");
    let table = Table::create("slow").await;
    table.set("pro-key", "pro").await;
    let app = instance(&server, &prefix, table.resolver()).await;

    // Another session holds the table: every read of it waits.
    let locker = pg().await;
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            table.name
        ))
        .await
        .unwrap();
    let (elapsed, logs) = logged(async {
        let start = Instant::now();
        assert_eq!(limit_seen(&app, "pro-key").await, 5, "base numbers");
        start.elapsed()
    })
    .await;
    let answered = Instant::now();
    assert!(elapsed >= LOOKUP_TIMEOUT, "{elapsed:?}");
    assert!(
        logs.contains(&format!("timed out after {LOOKUP_TIMEOUT:?}")),
        "cut off by the lookup timeout, not the layer's own bound: {logs}"
    );
    // Within the TTL the cached answer is used: no second wait (checked
    // only when this request did start within the TTL of the answer).
    let start = Instant::now();
    assert_eq!(limit_seen(&app, "pro-key").await, 5);
    if start.duration_since(answered) < TTL / 2 {
        assert!(start.elapsed() < LOOKUP_TIMEOUT, "{:?}", start.elapsed());
    }

    // Released: a lookup after the TTL reads the row, on a connection
    // that is not stuck behind the cut-off query (a stuck one never
    // answers). On a loaded machine one lookup may still miss the
    // timeout (a new connection to make): up to five TTLs, a lookup each.
    locker.batch_execute("ROLLBACK").await.unwrap();
    let mut seen = 5;
    for _ in 0..5 {
        tokio::time::sleep(TTL).await;
        seen = limit_seen(&app, "pro-key").await;
        if seen == 50 {
            break;
        }
    }
    assert_eq!(seen, 50);
}

#[tokio::test]
async fn a_plan_name_the_config_does_not_define_gives_the_base_numbers_and_is_logged() {
    let server = RedisServer::start();
    let prefix = prefix("pg-garbage");
    let table = Table::create("garbage").await;
    table
        .set("junk-subject", "\u{1b}[31m; DROP TABLE x; --")
        .await;
    table.set("typo-subject", "Pro ").await;
    table.set("fine-subject", "pro").await;
    let app = instance(&server, &prefix, table.resolver()).await;
    let ((junk, typo, fine), logs) = logged(async {
        (
            limit_seen(&app, "junk-subject").await,
            limit_seen(&app, "typo-subject").await,
            limit_seen(&app, "fine-subject").await,
        )
    })
    .await;
    assert_eq!(
        (junk, typo, fine),
        (5, 5, 50),
        "a bad row costs its caller only"
    );
    assert!(logs.contains("does not define"), "{logs}");
    assert!(logs.contains("DROP TABLE x"), "the plan named: {logs}");
    assert!(!logs.contains('\u{1b}'), "escaped in the log: {logs:?}");
    assert!(
        !logs.contains("-subject"),
        "the caller's key is not logged: {logs}"
    );
}

/// `examples/postgres_plans.rs` as a user runs it, on a table of this
/// test's own: a `pro` row gets the pro numbers (100 a minute), a key
/// without a row the base ones (10).
#[tokio::test]
async fn the_postgres_plans_example_serves_plans_from_its_table() {
    use support::example::Example;

    let table = Table::create("example").await;
    table.set("demo-pro", "pro").await;
    let ex = Example::start(
        "postgres_plans",
        &[],
        &[
            ("DATABASE_URL", &database_url()),
            ("FLEETLIMIT_PLANS_TABLE", &table.name),
        ],
    );
    assert!(
        ex.banner.contains("plans from postgres://"),
        "{}",
        ex.banner
    );
    let (status, raw) = ex.http("GET", "/", &[("x-api-key", "demo-pro")]);
    assert_eq!(status, 200, "{raw}");
    assert!(raw.contains("x-ratelimit-limit: 100"), "{raw}");
    let mut want = vec![200; 10];
    want.push(429);
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", "anyone")], 11),
        want
    );
}
