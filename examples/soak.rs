//! The soak command of issue 17; the code and its README live in tests/soak/. Not part of
//! `cargo test` (cargo builds this example there, and runs the checker's own unit tests):
//!
//! ```sh
//! cargo build --release --bin hookspool --example soak
//! target/release/examples/soak --duration 2m      # default 1h; needs root
//! ```

#[path = "../tests/soak/mod.rs"]
mod soak;

fn main() {
    std::process::exit(soak::main());
}
