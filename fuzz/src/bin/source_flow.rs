//! The `source_flow` fuzz target: see `hookspool_fuzz::targets::source_flow`.
fn main() {
    hookspool_fuzz::targets::main(hookspool_fuzz::targets::source_flow::check);
}
