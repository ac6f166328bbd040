//! The real `switchboard` CLI, built inside the tests crate so its integration tests can run it as
//! a process (`CARGO_BIN_EXE_switchboard-under-test`).

fn main() -> std::process::ExitCode {
    switchboard_core::cli::main()
}
