//! The integration tests, one module per file beside this one, linked
//! into one binary: one link instead of sixty, and one harness that runs
//! every file's tests two at a time (the cores), not one file after
//! another. Run one file's tests with a filter on its module:
//! `cargo test --all-features --test suite regions::`.
//!
//! Two files stay binaries of their own: `tests/metrics.rs` installs a
//! counting global allocator, which would count every other test's
//! allocations, and `tests/busy_host.rs` loads both cores on purpose and
//! asserts what a healthy Redis answers under that load alone.

mod support;

mod admin_cli;
mod admin_output;
mod admission;
mod algorithms;
mod bad_requests;
mod batch_window;
mod bounded_memory;
mod bounds;
mod chaos_cluster;
mod chaos_sentinel;
mod chaos_standalone;
mod client;
mod cluster_coalescing;
mod cluster_node_down;
mod cluster_redirects;
mod concurrency;
mod config_errors;
mod contract;
mod cost;
mod custom_keys;
mod differential;
mod doc_paths;
mod evidence;
mod examples;
mod expiry;
mod explain;
mod fleet;
mod grpc;
mod head_requests;
mod honest_headers;
mod in_flight;
mod late_checks;
mod layering;
mod leases;
mod log_volume;
mod login_defence;
mod login_example;
mod memory_only;
mod memory_store;
mod multi_limit;
mod one_door;
mod outage;
mod own_pool;
mod plans;
mod poisoned_keys;
#[cfg(feature = "postgres")]
mod postgres_plans;
mod quickstart;
mod redis_auth;
mod refund_handle;
mod refund_windows;
mod refused_cache;
mod regions;
mod regions_hardened;
mod reload;
mod reload_safety;
mod reset_reach;
mod rls;
mod rolling_upgrade;
mod script_flush;
mod shadow;
mod shedding;
mod slots_after_blip;
mod tls;
mod top;
mod validity;
mod write_back;

/// With `autotests = false`, a file of `tests/` that no `mod` line names
/// would never run: every one is a module here or a `[[test]]` of its own.
#[test]
fn every_file_of_tests_runs() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");
    let suite = std::fs::read_to_string(format!("{dir}/suite.rs")).unwrap();
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if module == "suite" {
            continue;
        }
        files += 1;
        let own_binary = manifest.contains(&format!("path = \"tests/{name}\""));
        assert!(
            suite.contains(&format!("\nmod {module};")) || own_binary,
            "tests/{name} is neither a module of tests/suite.rs nor a [[test]] in Cargo.toml"
        );
    }
    assert!(files > 60, "only {files} files found in {dir}");
}
