//! The `select` fuzz target: see `hookspool_fuzz::targets::select`.
fn main() {
    hookspool_fuzz::targets::main(hookspool_fuzz::targets::select::check);
}
