//! `examples/login.rs` keeps working: the example binary that `cargo test`
//! builds, driven over real HTTP with its bundled `examples/login.toml`.
// Redis in every test: not built without the `redis` feature.
#![cfg(feature = "redis")]

use crate::support;

use support::RedisServer;
use support::example::Example;

/// `POST /login` with `headers`.
fn login(ex: &Example, headers: &[(&str, &str)]) -> (u16, String) {
    ex.http("POST", "/login", headers)
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
    let ex = Example::start("login", &[], &[("REDIS_URL", &server.url())]);
    assert!(ex.banner.contains("using Redis at"), "{}", ex.banner);
    for _ in 0..3 {
        let (status, raw) = login(&ex, &ALICE);
        assert_eq!(status, 200, "{raw}");
        assert!(raw.contains("welcome, alice"), "{raw}");
    }
    let guesses: Vec<u16> = (0..6).map(|_| login(&ex, &GUESS).0).collect();
    assert_eq!(guesses, [401, 401, 401, 401, 401, 429]);
    let (status, raw) = login(&ex, &ALICE);
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
    let ex = Example::start("login", &[path.to_str().unwrap()], &[]);
    assert!(ex.banner.contains("in-process store"), "{}", ex.banner);
    let from = |ip: &'static str, h: &[(&'static str, &'static str)]| {
        let mut h = h.to_vec();
        h.push(("x-forwarded-for", ip));
        h
    };
    for ip in ["198.51.100.1", "198.51.100.2"] {
        for _ in 0..5 {
            let (status, raw) = login(&ex, &from(ip, &GUESS));
            assert_eq!(status, 401, "{raw}");
            assert!(!raw.contains(CHALLENGE), "{raw}");
        }
    }
    let (status, raw) = login(&ex, &from("198.51.100.3", &GUESS));
    assert_eq!(status, 401, "{raw}");
    assert!(raw.contains(CHALLENGE), "{raw}");
    let (status, raw) = login(&ex, &from("203.0.113.5", &ALICE));
    assert_eq!(status, 401, "the owner is challenged, not refused: {raw}");
    assert!(
        raw.contains(CHALLENGE) && raw.contains("per-account"),
        "{raw}"
    );
    let mut solved = from("203.0.113.5", &ALICE);
    solved.push(("x-captcha", "solved"));
    let (status, raw) = login(&ex, &solved);
    assert_eq!(status, 200, "{raw}");
    assert!(raw.contains("welcome, alice"), "{raw}");
    let _ = std::fs::remove_dir_all(&dir);
}
