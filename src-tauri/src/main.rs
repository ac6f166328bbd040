//! `switchboard-app`: the desktop window (see the library).
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() -> std::process::ExitCode {
    match switchboard_app::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchboard-app: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
