//! The built-in bobbins, compiled into the binary by `build.rs` from the repository's
//! `bobbins/` directory, so `cargo run -- run` and an uninstalled binary find them.
//!
//! Owns: the embedded file table ([`FILES`]: path relative to `bobbins/`, bytes), lookups in
//! it, and [`materialise`], which writes one built-in bobbin's files into a real directory for
//! the processor runtime (`HOOKSPOOL_BOBBIN_DIR` must name a directory; see
//! [`installed_dir`] for which one).
//!
//! Must not: read `bobbins/` at run time (what was built is what runs; the packages also
//! install the same files under [`INSTALLED_ROOT`]).

use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/bobbins_embedded.rs"));

/// Where the packages install the built-in bobbins.
pub const INSTALLED_ROOT: &str = "/usr/share/hookspool/bobbins";

/// Below the spool home: materialised copies of embedded built-ins, when the installed copy
/// is absent or differs from the running binary's.
pub const MATERIALISED_DIR: &str = "builtin-bobbins";

/// The bytes of one embedded file (`github/repo/bobbin.toml`).
pub fn file(rel: &str) -> Option<&'static [u8]> {
    FILES.iter().find(|(p, _)| *p == rel).map(|(_, b)| *b)
}

/// The embedded `<vendor>/<product>` directories that hold a bobbin.toml, in path order.
pub fn bobbin_dirs() -> Vec<(&'static str, &'static str)> {
    FILES
        .iter()
        .filter_map(|(p, _)| {
            let mut parts = p.split('/');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some(v), Some(prod), Some("bobbin.toml"), None) => Some((v, prod)),
                _ => None,
            }
        })
        .collect()
}

/// Every embedded file of one bobbin directory: (path relative to it, bytes).
pub fn files_of(vendor_dir: &str, product_dir: &str) -> Vec<(&'static str, &'static [u8])> {
    let prefix = format!("{vendor_dir}/{product_dir}/");
    FILES
        .iter()
        .filter_map(|(p, b)| p.strip_prefix(prefix.as_str()).map(|rel| (rel, *b)))
        .collect()
}

/// A built-in bobbin's directory at run time (`HOOKSPOOL_BOBBIN_DIR`) is
/// [`INSTALLED_ROOT`]`/<vendor>/<product>` when the packages installed exactly the files
/// this binary embeds (this function says whether they did), else
/// [`materialised_dir`], which [`materialise`] writes.
pub fn installed_dir(vendor_dir: &str, product_dir: &str) -> Option<PathBuf> {
    let installed = Path::new(INSTALLED_ROOT).join(vendor_dir).join(product_dir);
    same_files(&installed, vendor_dir, product_dir).then_some(installed)
}

/// `<home>/`[`MATERIALISED_DIR`]`/<vendor>/<product>`.
pub fn materialised_dir(vendor_dir: &str, product_dir: &str, home: &Path) -> PathBuf {
    home.join(MATERIALISED_DIR)
        .join(vendor_dir)
        .join(product_dir)
}

/// Whether `dir` holds exactly the embedded files of the bobbin, byte for byte.
fn same_files(dir: &Path, vendor_dir: &str, product_dir: &str) -> bool {
    let files = files_of(vendor_dir, product_dir);
    !files.is_empty()
        && files
            .iter()
            .all(|(rel, bytes)| std::fs::read(dir.join(rel)).is_ok_and(|b| b == *bytes))
}

/// Makes a processor's bobbin directory usable before the runtime starts in it (the
/// destination calls this before every spawn): when `dir` is the materialised copy of the
/// built-in `bobbin` under `home`, its files are (re)written from the binary; any other
/// directory (the installed copy, a `spool.bobbin_path` bobbin) must exist already.
pub fn ensure_run_dir(bobbin: &str, dir: &Path, home: &Path) -> std::io::Result<()> {
    for (vendor_dir, product_dir) in bobbin_dirs() {
        let named = super::name::BobbinName::from_dirs(vendor_dir, product_dir)
            .is_ok_and(|n| n.to_string() == bobbin);
        if named && materialised_dir(vendor_dir, product_dir, home) == dir {
            let text = file(&format!("{vendor_dir}/{product_dir}/bobbin.toml"))
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            let manifest = super::manifest::Manifest::parse(&text).map_err(|_| {
                std::io::Error::other("the embedded manifest does not parse (a build bug)")
            })?;
            materialise(vendor_dir, product_dir, home, &manifest.executables())?;
            return Ok(());
        }
    }
    if dir.is_dir() {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the bobbin directory is missing; reinstall the bobbin or run hookspool reload",
        ))
    }
}

/// Writes the embedded files of one bobbin under `<home>/builtin-bobbins/<vendor>/<product>`
/// and returns the directory (see [`write_files`]).
pub fn materialise(
    vendor_dir: &str,
    product_dir: &str,
    home: &Path,
    executables: &[&str],
) -> std::io::Result<PathBuf> {
    let dir = materialised_dir(vendor_dir, product_dir, home);
    write_files(&dir, &files_of(vendor_dir, product_dir), executables)?;
    Ok(dir)
}

/// Writes `files` below `dir`: each to a temporary name, fsynced, then renamed, and the
/// directory fsynced; mode 0755 for the `executables` (the processor or poller the manifest
/// names), 0644 otherwise. A file already identical, mode included, is left alone, so two
/// processor starts do not race on it.
pub fn write_files(
    dir: &Path,
    files: &[(&str, &[u8])],
    executables: &[&str],
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for (rel, bytes) in files {
        let path = dir.join(rel);
        let mode = if executables.contains(rel) {
            0o755
        } else {
            0o644
        };
        let current = std::fs::read(&path).ok();
        let mode_ok =
            std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o777 == mode);
        if current.as_deref() == Some(*bytes) && mode_ok {
            continue;
        }
        let parent = path.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        crate::sys::fs::atomic_write(parent, &name, bytes, mode)?;
    }
    Ok(())
}
