//! Embeds every file under `bobbins/` into the binary, so `cargo run -- run` finds the
//! built-in bobbins with no install step (spec 14.3.1; `src/bobbins/embedded.rs` reads the
//! table this writes), and sets `HOOKSPOOL_VERSION`, the version `hookspool --version`
//! prints: the package's, followed by ` (test build: <what>)` when `HOOKSPOOL_TEST_BUILD`
//! is set at compile time (tests/systemd/build-next.sh sets it: a binary with a probe
//! migration must say what it is before anyone runs it on a spool).
//!
//! The generated `$OUT_DIR/bobbins_embedded.rs` holds one `(relative path, bytes)` pair per
//! file, sorted by path, each through `include_bytes!` so cargo tracks the file itself.
//! `rerun-if-changed=bobbins` makes cargo rebuild when any file in that tree changes or is
//! added or removed (cargo scans a directory argument recursively).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Set (non-empty) at compile time for a build that is not a release: its text is appended
/// to the version.
const TEST_BUILD_ENV: &str = "HOOKSPOOL_TEST_BUILD";

fn main() {
    println!("cargo:rerun-if-env-changed={TEST_BUILD_ENV}");
    let package = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    let version = match std::env::var(TEST_BUILD_ENV) {
        // One line whatever it holds: cargo reads the directive line by line.
        Ok(what) if !what.trim().is_empty() => format!(
            "{package} (test build: {})",
            what.split_whitespace().collect::<Vec<_>>().join(" ")
        ),
        _ => package,
    };
    println!("cargo:rustc-env=HOOKSPOOL_VERSION={version}");
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("bobbins");
    println!("cargo:rerun-if-changed=bobbins");
    let mut files = Vec::new();
    if root.is_dir() {
        walk(&root, &root, &mut files);
    }
    files.sort();
    let mut out = String::from("pub static FILES: &[(&str, &[u8])] = &[\n");
    for (rel, abs) in &files {
        // Debug formatting escapes both strings as Rust literals.
        writeln!(out, "    ({rel:?}, include_bytes!({abs:?})),").expect("write to a String");
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("bobbins_embedded.rs");
    std::fs::write(&dest, out).expect("write the embedded bobbin table");
}

/// Every regular file below `dir`, as (path relative to `root` with `/`, absolute path).
/// Hidden entries (editor swap files, `.git`) are left out.
fn walk(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read a directory under bobbins/")
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            walk(root, &path, files);
        } else if kind.is_file() {
            let rel = path
                .strip_prefix(root)
                .expect("walked below root")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            files.push((rel, path.display().to_string()));
        }
    }
}
