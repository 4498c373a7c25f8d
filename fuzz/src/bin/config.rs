//! The `config` fuzz target: see `hookspool_fuzz::targets::config`.
fn main() {
    hookspool_fuzz::targets::main(hookspool_fuzz::targets::config::check);
}
