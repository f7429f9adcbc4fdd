//! A reload cannot take the service down: a configuration path that
//! blocks on read (a FIFO here; a hung mount does the same) costs a
//! thread, never the answers; an empty or truncated file is refused unless
//! forced; a file caught mid-write is taken whole. Through the quickstart
//! (the README's hot-reload recipe) and through the library's API.
#![cfg(unix)]

use crate::support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fleetlimit::reload::ReloadError;
use fleetlimit::{Config, RateLimitLayer};
use support::example::Example;

/// The library's defaults, which the quickstart uses.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const SETTLE: Duration = Duration::from_secs(1);

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "fleetlimit-reload-safety-{}-{tag}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bundled() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/quickstart.toml"
    ))
    .unwrap()
}

fn signal(ex: &Example, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &ex.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// The quickstart on `path`, logging fleetlimit's warnings to its stdout
/// (a pipe: no colour).
fn quickstart(path: &Path) -> Example {
    Example::start(
        "quickstart",
        &[path.to_str().unwrap()],
        &[("RUST_LOG", "fleetlimit=warn")],
    )
}

/// The case: the path is a FIFO nobody writes. Every request is
/// answered while the read hangs, the hang is reported at the timeout (and
/// logged, without colour codes), a later SIGHUP is answered at once, and
/// once the path reads again a reload applies.
#[test]
fn a_blocking_path_never_stops_the_answers() {
    let d = dir("fifo");
    let path = d.join("quickstart.toml");
    std::fs::write(&path, bundled()).unwrap();
    let ex = quickstart(&path);
    mkfifo(&path);
    let started = Instant::now();
    signal(&ex, "-HUP");
    // Answered throughout the hang, limits and all.
    let mut statuses = Vec::new();
    while started.elapsed() < READ_TIMEOUT / 2 {
        let key = format!("during-{}", statuses.len());
        statuses.extend(ex.statuses("GET", "/", &[("x-api-key", &key)], 1));
    }
    assert!(
        statuses.len() >= 2 && statuses.iter().all(|&s| s == 200),
        "{statuses:?}"
    );
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", "hung")], 6),
        [200, 200, 200, 200, 200, 429]
    );
    let wait = READ_TIMEOUT * 3;
    let warned = ex.line_containing("did not finish in time", wait);
    assert!(
        !warned.contains('\x1b'),
        "colour codes in a pipe: {warned:?}"
    );
    let line = ex.line_starting("reload", wait);
    assert_eq!(
        line,
        format!(
            "reload failed, the running limits are kept: {}: not read within 5s (a FIFO, or a hung mount?); the running configuration is kept",
            path.display()
        )
    );
    // A second SIGHUP is answered, not lost: the first read still holds
    // its thread, so none is started beside it.
    signal(&ex, "-HUP");
    let line = ex.line_starting("reload", wait);
    assert!(
        line.contains("an earlier read of the configuration has not finished"),
        "{line}"
    );
    assert_eq!(ex.http("POST", "/sign-in", &[]).0, 401, "still serving");

    // The FIFO gets a writer: the stuck read ends (its result is not
    // applied: it was reported as failed). Then a regular file reloads.
    let mut fifo = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    fifo.write_all(bundled().as_bytes()).unwrap();
    drop(fifo);
    std::fs::remove_file(&path).unwrap();
    std::fs::write(
        &path,
        bundled().replacen("capacity = 5\n", "capacity = 2\n", 1),
    )
    .unwrap();
    let mut line = String::new();
    for _ in 0..50 {
        signal(&ex, "-HUP");
        line = ex.line_starting("reload", wait);
        if !line.contains("an earlier read") {
            break;
        }
    }
    assert_eq!(
        line,
        format!("reloaded {}: limits changed: per-key", path.display())
    );
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", "after")], 3),
        [200, 200, 429]
    );
    drop(ex);
    let _ = std::fs::remove_dir_all(&d);
}

/// `: > cfg.toml; kill -HUP`: refused, the limits kept; SIGUSR1 applies it
/// on purpose.
#[test]
fn an_empty_file_is_refused_unless_forced() {
    let d = dir("empty");
    let path = d.join("quickstart.toml");
    std::fs::write(&path, bundled()).unwrap();
    let ex = quickstart(&path);
    std::fs::write(&path, "").unwrap();
    signal(&ex, "-HUP");
    let wait = READ_TIMEOUT + SETTLE * 3;
    let line = ex.line_starting("reload", wait);
    assert_eq!(
        line,
        format!(
            "reload failed, the running limits are kept: refusing to reload: the new configuration limits nothing \
             (no [[routes]] entry and no [default] names a limit) (limits removed: per-account, per-key; \
             routes removed: GET /, GET /search, POST /sign-in; settings changed: [headers] style, [fleet] size); \
             an empty or half-written file? Force the reload if this is meant; the running configuration is kept \
             (`kill -USR1 {}` applies it)",
            ex.pid()
        )
    );
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", "kept")], 6),
        [200, 200, 200, 200, 200, 429]
    );
    signal(&ex, "-USR1");
    let line = ex.line_starting("reload", wait);
    assert!(
        line.starts_with(&format!(
            "reloaded {}: limits removed: per-account, per-key",
            path.display()
        )),
        "{line}"
    );
    assert_eq!(
        ex.statuses("GET", "/", &[("x-api-key", "kept")], 7),
        [200; 7],
        "unlimited, as forced"
    );
    drop(ex);
    let _ = std::fs::remove_dir_all(&d);
}

/// A writer caught mid-write (truncate, part written, SIGHUP, the rest):
/// the reload takes the whole file, not the prefix that parsed. The prefix
/// here removes one route of five: not enough for the guard, so it is the
/// wait for the file to settle that keeps it out.
#[test]
fn a_file_caught_mid_write_is_taken_whole() {
    let d = dir("midwrite");
    let path = d.join("quickstart.toml");
    std::fs::write(&path, bundled()).unwrap();
    let ex = quickstart(&path);
    let edited = bundled().replacen("capacity = 5\n", "capacity = 2\n", 1);
    let cut = edited.rfind("[[routes]]").unwrap();
    let (head, tail) = edited.split_at(cut);
    assert!(Config::from_toml_str(head).is_ok(), "the prefix parses");
    std::fs::write(&path, head).unwrap();
    signal(&ex, "-HUP");
    // The rest, well within the settle time of the first part.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(tail.as_bytes()).unwrap();
    drop(f);
    let line = ex.line_starting("reload", READ_TIMEOUT + SETTLE * 3);
    assert_eq!(
        line,
        format!("reloaded {}: limits changed: per-key", path.display())
    );
    assert_eq!(
        ex.statuses("GET", "/search", &[("x-api-key", "s")], 2),
        [200, 429],
        "/search kept, at cost 2 of the new 2"
    );
    drop(ex);
    let _ = std::fs::remove_dir_all(&d);
}

fn two_by_two(routes: &[&str]) -> String {
    let mut s = String::from(
        "[limits.a]\nkey = \"ip\"\ncapacity = 5\nrefill = \"1/s\"\n\n\
         [limits.b]\nkey = \"ip\"\ncapacity = 5\nrefill = \"1/s\"\n",
    );
    for (i, r) in routes.iter().enumerate() {
        let limit = if i % 2 == 0 { "a" } else { "b" };
        s.push_str(&format!(
            "\n[[routes]]\npath = \"{r}\"\nlimits = [\"{limit}\"]\n"
        ));
    }
    s
}

/// The guard in the library: at most half of the limits and routes go
/// unforced (or the configured share), never all of them.
#[tokio::test]
async fn the_guard_counts_what_a_reload_removes() {
    let layer = RateLimitLayer::new(Config::from_toml_str(&two_by_two(&["/a", "/b"])).unwrap())
        .await
        .unwrap();
    let reload = layer.reload_handle();
    // Routes /b and limit b go, with /a renamed: 3 of 4.
    let most =
        Config::from_toml_str(&two_by_two(&["/z"]).replace("[limits.b]", "[limits.c]")).unwrap();
    match reload.reload(most.clone()) {
        Err(ReloadError::Drastic { why, changes }) => {
            assert_eq!(
                why,
                "it removes 3 of the 4 limits and routes, more than the 50% a reload may remove unforced"
            );
            assert_eq!(changes.routes_removed(), ["* /a", "* /b"]);
        }
        other => panic!("{other:?}"),
    }
    let lenient = reload.clone().max_removed_share(1.0);
    let changes = lenient.reload(most).unwrap();
    assert_eq!(changes.limits_removed(), ["b"]);
    // Half is allowed: /z goes, /y comes.
    let half =
        Config::from_toml_str(&two_by_two(&["/y"]).replace("[limits.b]", "[limits.c]")).unwrap();
    assert!(reload.reload(half).is_ok());
    // Nothing limited: refused even at a share of 1, applied when forced.
    let empty = Config::from_toml_str("").unwrap();
    let err = lenient.reload(empty.clone()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("refusing to reload: the new configuration limits nothing"),
        "{err}"
    );
    lenient.clone().force(true).reload(empty.clone()).unwrap();
    // From nothing limited to nothing limited: nothing to guard.
    reload.reload(empty).unwrap();
}

/// `reload_file` on a FIFO: a timeout, one thread at most, and reloads
/// again once the path reads.
#[tokio::test]
async fn reload_file_gives_up_on_a_blocking_path() {
    let d = dir("lib-fifo");
    let path = d.join("limits.toml");
    std::fs::write(&path, two_by_two(&["/a"])).unwrap();
    let layer = RateLimitLayer::new(Config::from_toml_file(&path).unwrap())
        .await
        .unwrap();
    let reload = layer.reload_handle();
    mkfifo(&path);
    let quick = reload
        .clone()
        .read_timeout(Duration::from_millis(200))
        .settle(Duration::ZERO);
    let err = quick.reload_file(&path).await.unwrap_err();
    assert!(matches!(err, ReloadError::ReadTimeout { .. }), "{err}");
    let err = quick.reload_file(&path).await.unwrap_err();
    assert!(matches!(err, ReloadError::StillReading { .. }), "{err}");
    // A writer frees the stuck read.
    let fifo_path = path.clone();
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo_path)
            .unwrap();
        f.write_all(two_by_two(&["/a"]).as_bytes()).unwrap();
    });
    writer.join().unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, two_by_two(&["/a", "/b"])).unwrap();
    let mut result = quick.reload_file(&path).await;
    for _ in 0..100 {
        if !matches!(result, Err(ReloadError::StillReading { .. })) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        result = quick.reload_file(&path).await;
    }
    assert_eq!(result.unwrap().routes_added(), ["* /b"]);
    // A file with an error names its place.
    std::fs::write(&path, "[limits.a\n").unwrap();
    let err = quick.reload_file(&path).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{}:1:", path.display())),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
