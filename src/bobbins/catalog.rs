//! Discovery: the bobbins a config can use (spec 14.3.1, 14.3.6).
//!
//! Owns: [`Catalog::load`], which reads the built-in bobbins from the binary ([`embedded`])
//! and then each `spool.bobbin_path` directory, every time it is called (manifests are
//! re-read on every config load; nothing is cached), and the rules that decide whether a
//! directory's bobbin is usable: its directory is `<vendor>/<product>/` for the manifest's
//! name (`_` may stand for `-`), `hookspool.` is core's alone, no bobbin shadows a built-in,
//! two directories never name one bobbin, and code loaded by path is an absolute, regular
//! directory or file, not group- or other-writable, owned by root or the user hookspool runs
//! as. A bobbin that breaks a rule is left out and its problem kept as a [`Finding`]
//! (`file:line: what to write instead`), which `hookspool check` reports as an error.
//! The same rules for the code a bobbin's processor or poller runs or loads
//! ([`check_code`]), which `check` and the script destination apply to an instance's
//! run-time directory.
//!
//! Must not: expand instances or judge documents and captures (those are [`super::expand`]
//! and the kit (`hookspool bobbin check`)).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Finding;
use super::embedded;
use super::manifest::Manifest;
use super::name::BobbinName;

pub const MANIFEST_FILE: &str = "bobbin.toml";

/// Where a bobbin was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Compiled into the binary from the repository's `bobbins/`.
    BuiltIn,
    /// Below this `spool.bobbin_path` root.
    Path(PathBuf),
}

impl Origin {
    /// For `bobbin list`: "built-in" or the root.
    pub fn label(&self) -> String {
        match self {
            Origin::BuiltIn => "built-in".into(),
            Origin::Path(root) => root.display().to_string(),
        }
    }
}

/// One usable bobbin.
#[derive(Debug, Clone)]
pub struct Entry {
    pub manifest: Manifest,
    pub origin: Origin,
    /// The directory names as written below the root (`_` may stand for `-`).
    pub vendor_dir: String,
    pub product_dir: String,
    /// A built-in's installed copy under [`embedded::INSTALLED_ROOT`], when the packages
    /// installed exactly the files this binary embeds (decided at load).
    pub installed: Option<PathBuf>,
}

impl Entry {
    /// The bobbin's directory at run time (`HOOKSPOOL_BOBBIN_DIR`): a path bobbin's own
    /// directory; a built-in's installed copy, else its materialised copy under the home
    /// ([`embedded::materialised_dir`], written by [`embedded::materialise`]).
    pub fn run_dir(&self, home: &Path) -> PathBuf {
        match (&self.origin, &self.installed) {
            (Origin::Path(root), _) => root.join(&self.vendor_dir).join(&self.product_dir),
            (Origin::BuiltIn, Some(dir)) => dir.clone(),
            (Origin::BuiltIn, None) => {
                embedded::materialised_dir(&self.vendor_dir, &self.product_dir, home)
            }
        }
    }

    /// The executables the manifest names (processor or poller), relative to its directory.
    pub fn executables(&self) -> Vec<&str> {
        self.manifest.executables()
    }
}

/// The bobbins found, built-ins first, and what was wrong with the ones left out.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    entries: Vec<Entry>,
    problems: Vec<Finding>,
}

impl Catalog {
    /// The built-in bobbins only (no config, or a config without `spool.bobbin_path`).
    pub fn builtin() -> Catalog {
        Catalog::load(&[])
    }

    /// Built-ins, then each `spool.bobbin_path` root in order.
    pub fn load(bobbin_path: &[PathBuf]) -> Catalog {
        let mut c = Catalog::default();
        for (vendor_dir, product_dir) in embedded::bobbin_dirs() {
            let file = format!("bobbins/{vendor_dir}/{product_dir}/{MANIFEST_FILE}");
            let text = embedded::file(&format!("{vendor_dir}/{product_dir}/{MANIFEST_FILE}"))
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            c.add(&file, &text, Origin::BuiltIn, vendor_dir, product_dir);
        }
        for (rel, _) in embedded::FILES {
            let parts: Vec<&str> = rel.split('/').collect();
            if parts.len() == 2 {
                c.problems.push(Finding::new(
                    format!("bobbins/{rel}"),
                    0,
                    "a vendor directory holds its bobbins' directories and nothing else; move the file into a <vendor>/<product>/ directory or remove it",
                ));
            }
        }
        for root in bobbin_path {
            c.load_root(root);
        }
        c
    }

    /// This catalogue with `entry` in it, replacing a bobbin of the same name (the kit
    /// checks a directory that may not be installed yet).
    pub fn with_entry(mut self, entry: Entry) -> Catalog {
        self.entries
            .retain(|e| e.manifest.name != entry.manifest.name);
        self.entries.push(entry);
        self
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn problems(&self) -> &[Finding] {
        &self.problems
    }

    /// The bobbin called `name` (`google.gmail`).
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.manifest.name.to_string() == name)
    }

    fn load_root(&mut self, root: &Path) {
        let label = root.display().to_string();
        if let Err(why) = check_loadable(root, true) {
            self.problems
                .push(Finding::new(label, 0, format!("spool.bobbin_path: {why}")));
            return;
        }
        for vendor in sorted_dir(root) {
            let vpath = root.join(&vendor);
            if !vpath.is_dir() {
                continue;
            }
            if let Err(why) = check_loadable(&vpath, true) {
                self.problems
                    .push(Finding::new(vpath.display().to_string(), 0, why));
                continue;
            }
            for product in sorted_dir(&vpath) {
                let dir = vpath.join(&product);
                let manifest = dir.join(MANIFEST_FILE);
                if !manifest.exists() {
                    continue;
                }
                let file = manifest.display().to_string();
                if let Err(why) = check_loadable(&dir, true).and(check_loadable(&manifest, false)) {
                    self.problems.push(Finding::new(file, 0, why));
                    continue;
                }
                match std::fs::read_to_string(&manifest) {
                    Ok(text) => self.add(
                        &file,
                        &text,
                        Origin::Path(root.to_path_buf()),
                        &vendor,
                        &product,
                    ),
                    Err(e) => self.problems.push(Finding::new(
                        file,
                        0,
                        format!(
                            "cannot be read ({}); make it readable by the service user",
                            e.kind()
                        ),
                    )),
                }
            }
        }
    }

    fn add(&mut self, file: &str, text: &str, origin: Origin, vendor_dir: &str, product_dir: &str) {
        let manifest = match Manifest::parse(text) {
            Ok(m) => m,
            Err(problems) => {
                self.problems.extend(
                    problems
                        .into_iter()
                        .map(|p| Finding::new(file, p.line, p.message)),
                );
                return;
            }
        };
        let builtin = matches!(origin, Origin::BuiltIn);
        let existing = self
            .entries
            .iter()
            .find(|e| e.manifest.name == manifest.name)
            .map(|e| e.origin.clone());
        if let Err(why) = check_layout(
            &manifest.name,
            vendor_dir,
            product_dir,
            builtin,
            existing.as_ref(),
        ) {
            let line = super::locate::Locator::new(text).line(&["name"]);
            self.problems.push(Finding::new(file, line, why));
            return;
        }
        let installed = if builtin {
            embedded::installed_dir(vendor_dir, product_dir)
        } else {
            None
        };
        self.entries.push(Entry {
            manifest,
            origin,
            vendor_dir: vendor_dir.to_string(),
            product_dir: product_dir.to_string(),
            installed,
        });
    }
}

/// The name rules a directory's bobbin must keep (14.3.1). `existing` is the origin of an
/// already-found bobbin of the same name.
pub fn check_layout(
    name: &BobbinName,
    vendor_dir: &str,
    product_dir: &str,
    builtin: bool,
    existing: Option<&Origin>,
) -> Result<(), String> {
    match BobbinName::from_dirs(vendor_dir, product_dir) {
        Ok(dir_name) if dir_name == *name => {}
        _ => {
            return Err(format!(
                "name: the manifest says {name} but the directory is {vendor_dir}/{product_dir}/; move it to {}/ or write name = \"{}\"",
                name.rel_dir(),
                BobbinName::from_dirs(vendor_dir, product_dir)
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "<vendor>.<product>".into())
            ));
        }
    }
    if name.is_reserved() && !builtin {
        return Err(format!(
            "name: the {} namespace is reserved for the bobbins shipped with hookspool; name it after the service's vendor, e.g. acme.{}",
            super::name::RESERVED_VENDOR,
            name.product()
        ));
    }
    match existing {
        None => Ok(()),
        Some(Origin::BuiltIn) if !builtin => Err(format!(
            "name: {name} is a built-in bobbin and cannot be shadowed; change behaviour through its settings, or give this bobbin a name of its own"
        )),
        Some(o) => Err(format!(
            "name: {name} is already defined (in {}); two directories that differ only by - and _ name the same bobbin: keep one",
            o.label()
        )),
    }
}

/// 14.3.6 for code loaded by path: absolute, a regular directory (or file), not group- or
/// other-writable, owned by root or the user hookspool runs as.
pub fn check_loadable(path: &Path, dir: bool) -> Result<(), String> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(format!("{shown} is relative; write an absolute path"));
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| {
        format!(
            "{shown} cannot be read ({}); create it or remove it from the list",
            e.kind()
        )
    })?;
    let kind_ok = if dir { meta.is_dir() } else { meta.is_file() };
    if !kind_ok {
        return Err(format!(
            "{shown} is not a regular {} (a symlink or another kind); point at the real {} instead",
            if dir { "directory" } else { "file" },
            if dir { "directory" } else { "file" }
        ));
    }
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(format!(
            "{shown} is group- or other-writable (mode {:o}); run chmod go-w {shown}",
            mode & 0o777
        ));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if !owner_ok(meta.uid(), euid) {
        return Err(format!(
            "{shown} is owned by uid {}; it must belong to root or to the user hookspool runs as (uid {euid}): run chown root {shown}",
            meta.uid()
        ));
    }
    Ok(())
}

/// 14.3.6 for a bobbin's code (issue 29): every file its processor or poller runs or loads
/// ([`Manifest::code_files`]) is a regular file, not group- or other-writable, owned by root
/// or the user hookspool runs as, and so is each directory from the file's up to the
/// bobbin's root (`<root>/<vendor>/<product>/` is `dir`); an `exec` file is executable.
/// Each problem names the file, the manifest key and the fix. `hookspool check` runs it for
/// every instance, and the script destination before every processor start, so a file
/// changed after the check is refused too.
pub fn check_code(dir: &Path, m: &Manifest) -> Vec<String> {
    let manifest = dir.join(MANIFEST_FILE);
    let root = dir.ancestors().nth(2).unwrap_or(dir);
    let mut out = Vec::new();
    for (key, rel) in m.code_files() {
        let file = dir.join(rel);
        let at = format!("{} ({key} in {})", file.display(), manifest.display());
        if std::fs::symlink_metadata(&file).is_err() {
            out.push(format!(
                "{at} does not exist; install the bobbin's file or fix {key}"
            ));
            continue;
        }
        let mut why = check_loadable(&file, false).err();
        if why.is_none() && key.ends_with(".exec") && !is_executable(&file) {
            why = Some(format!(
                "{} is not executable; run chmod 755 {}",
                file.display(),
                file.display()
            ));
        }
        let parents = file.ancestors().skip(1).take_while(|d| d.starts_with(root));
        for d in parents {
            if why.is_some() {
                break;
            }
            why = check_loadable(d, true).err();
        }
        if let Some(why) = why {
            out.push(format!(
                "{at}: {why}; the dispatcher refuses to run the bobbin's code until it is fixed"
            ));
        }
    }
    out
}

/// [`check_code`] for the bobbin whose run-time directory is `dir`, with the manifest read
/// from it: what the script destination calls before it starts a processor. A manifest
/// that cannot be read or parsed is the runtime's to report (it refuses to run then).
pub fn check_run_dir_code(dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(MANIFEST_FILE)) else {
        return Vec::new();
    };
    match Manifest::parse(&text) {
        Ok(m) => check_code(dir, &m),
        Err(_) => Vec::new(),
    }
}

/// 14.3.6 for a deployment's hooks program (`settings.hooks`): an absolute path to a
/// regular, executable file, not group- or other-writable, owned by root or the user
/// hookspool runs as, and so is each directory above it up to `/`, except that a
/// root-owned directory with the sticky bit (`/tmp`) may be writable by others: nobody but
/// an entry's owner can rename or remove what is in it. `Err` says what is wrong and the fix.
pub fn check_hooks(path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!(
            "{} is relative; write an absolute path",
            path.display()
        ));
    }
    if std::fs::symlink_metadata(path).is_err() {
        return Err(format!(
            "{} does not exist; install the hooks program there or fix settings.hooks",
            path.display()
        ));
    }
    check_loadable(path, false)?;
    if !is_executable(path) {
        return Err(format!(
            "{} is not executable; run chmod 755 {}",
            path.display(),
            path.display()
        ));
    }
    for d in path.ancestors().skip(1) {
        let sticky_root = std::fs::symlink_metadata(d)
            .is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.permissions().mode() & 0o1000 != 0);
        if !sticky_root {
            check_loadable(d, true)?;
        }
    }
    Ok(())
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// Owned by root or by the user hookspool runs as.
pub fn owner_ok(owner_uid: u32, euid: u32) -> bool {
    owner_uid == 0 || owner_uid == euid
}

/// The names in a directory, sorted, hidden entries left out.
fn sorted_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
