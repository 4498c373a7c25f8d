//! The `recipe` fuzz target: see `hookspool_fuzz::targets::recipe`.
fn main() {
    hookspool_fuzz::targets::main(hookspool_fuzz::targets::recipe::check);
}
