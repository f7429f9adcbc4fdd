//! `fleetlimit`: the operator's command. It lives in the library's `cli`
//! feature (`src/cli/`), so that its admin internals stay crate-private.

fn main() -> std::process::ExitCode {
    fleetlimit::cli::main()
}
