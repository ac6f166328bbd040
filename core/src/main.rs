//! The `switchboard` binary: see [`switchboard_core::cli`].

fn main() -> std::process::ExitCode {
    switchboard_core::cli::main()
}
