//! The `capture` fuzz target: see `hookspool_fuzz::targets::capture`.
fn main() {
    hookspool_fuzz::targets::main(hookspool_fuzz::targets::capture::check);
}
