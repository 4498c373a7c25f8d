//! Discovery rules (spec 14.3.1, 14.3.6) on real directories.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::manifest::GITHUB;
use crate::bobbins::catalog::{Catalog, Origin, check_layout, check_loadable, owner_ok};
use crate::bobbins::embedded;
use crate::bobbins::name::BobbinName;

fn write_bobbin(root: &Path, vendor_dir: &str, product_dir: &str, name: &str) -> PathBuf {
    let dir = root.join(vendor_dir).join(product_dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = GITHUB.replace("name = \"github.repo\"", &format!("name = \"{name}\""));
    std::fs::write(dir.join("bobbin.toml"), text).unwrap();
    dir
}

fn messages(c: &Catalog) -> Vec<String> {
    c.problems().iter().map(|p| p.to_string()).collect()
}

#[test]
fn catalog_loads_a_bobbin_path_root() {
    let t = tempfile::tempdir().unwrap();
    write_bobbin(t.path(), "acme", "widgets", "acme.widgets");
    let c = Catalog::load(&[t.path().to_path_buf()]);
    assert_eq!(messages(&c), Vec::<String>::new());
    let e = c.get("acme.widgets").expect("found");
    assert_eq!(e.origin, Origin::Path(t.path().to_path_buf()));
    assert_eq!(e.run_dir(Path::new("/home")), t.path().join("acme/widgets"));
}

#[test]
fn catalog_rereads_manifests_on_every_load() {
    let t = tempfile::tempdir().unwrap();
    let dir = write_bobbin(t.path(), "acme", "widgets", "acme.widgets");
    let root = [t.path().to_path_buf()];
    assert_eq!(
        Catalog::load(&root)
            .get("acme.widgets")
            .unwrap()
            .manifest
            .version,
        "1"
    );
    let text = std::fs::read_to_string(dir.join("bobbin.toml")).unwrap();
    std::fs::write(
        dir.join("bobbin.toml"),
        text.replace("version = \"1\"", "version = \"2\""),
    )
    .unwrap();
    assert_eq!(
        Catalog::load(&root)
            .get("acme.widgets")
            .unwrap()
            .manifest
            .version,
        "2"
    );
}

#[test]
fn catalog_rule_directory_is_vendor_product() {
    let t = tempfile::tempdir().unwrap();
    write_bobbin(t.path(), "acme", "gadgets", "acme.widgets");
    let c = Catalog::load(&[t.path().to_path_buf()]);
    assert!(c.get("acme.widgets").is_none());
    let m = messages(&c);
    assert!(m[0].contains("acme/gadgets/bobbin.toml:2: name: the manifest says acme.widgets but the directory is acme/gadgets/"), "{m:?}");
}

#[test]
fn catalog_rule_underscore_spells_dash() {
    let t = tempfile::tempdir().unwrap();
    write_bobbin(
        t.path(),
        "acme_corp",
        "big_widgets",
        "acme-corp.big-widgets",
    );
    let c = Catalog::load(&[t.path().to_path_buf()]);
    assert!(
        c.get("acme-corp.big-widgets").is_some(),
        "{:?}",
        messages(&c)
    );
}

#[test]
fn catalog_rule_dash_underscore_collision_refused() {
    let t = tempfile::tempdir().unwrap();
    write_bobbin(t.path(), "acme", "big-widgets", "acme.big-widgets");
    write_bobbin(t.path(), "acme", "big_widgets", "acme.big-widgets");
    let c = Catalog::load(&[t.path().to_path_buf()]);
    let from_root = c
        .entries()
        .iter()
        .filter(|e| e.origin == Origin::Path(t.path().to_path_buf()))
        .count();
    assert_eq!(from_root, 1);
    let m = messages(&c);
    assert!(
        m.iter()
            .any(|p| p
                .contains("big_widgets/bobbin.toml:2: name: acme.big-widgets is already defined")),
        "{m:?}"
    );
}

#[test]
fn catalog_rule_reserved_namespace() {
    let t = tempfile::tempdir().unwrap();
    write_bobbin(t.path(), "hookspool", "webhook2", "hookspool.webhook2");
    let c = Catalog::load(&[t.path().to_path_buf()]);
    assert!(
        c.entries()
            .iter()
            .all(|e| e.manifest.name.to_string() != "hookspool.webhook2")
    );
    assert!(
        messages(&c)
            .iter()
            .any(|m| m.contains("namespace is reserved")),
        "{:?}",
        messages(&c)
    );
}

#[test]
fn catalog_rule_no_shadowing_of_a_builtin() {
    let name = BobbinName::parse("github.repo").unwrap();
    let e = check_layout(&name, "github", "repo", false, Some(&Origin::BuiltIn)).unwrap_err();
    assert!(
        e.contains("is a built-in bobbin and cannot be shadowed"),
        "{e}"
    );
    assert!(check_layout(&name, "github", "repo", true, None).is_ok());
    // Two private roots with one name: the second is refused, naming the first.
    let e = check_layout(
        &name,
        "github",
        "repo",
        false,
        Some(&Origin::Path("/a".into())),
    )
    .unwrap_err();
    assert!(e.contains("already defined (in /a)"), "{e}");
}

#[test]
fn catalog_rule_loadable_paths() {
    let t = tempfile::tempdir().unwrap();
    assert!(
        check_loadable(Path::new("relative/dir"), true)
            .unwrap_err()
            .contains("write an absolute path")
    );
    let missing = t.path().join("missing");
    assert!(
        check_loadable(&missing, true)
            .unwrap_err()
            .contains("cannot be read")
    );
    let f = t.path().join("file");
    std::fs::write(&f, "x").unwrap();
    assert!(
        check_loadable(&f, true)
            .unwrap_err()
            .contains("not a regular directory")
    );
    assert!(check_loadable(&f, false).is_ok());
    let link = t.path().join("link");
    std::os::unix::fs::symlink(t.path(), &link).unwrap();
    assert!(check_loadable(&link, true).unwrap_err().contains("symlink"));
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o646)).unwrap();
    assert!(
        check_loadable(&f, false)
            .unwrap_err()
            .contains("chmod go-w")
    );
    assert!(owner_ok(0, 999) && owner_ok(999, 999) && !owner_ok(1000, 999));
}

#[test]
fn catalog_unreadable_root_is_one_problem() {
    let c = Catalog::load(&[PathBuf::from("/nonexistent/hookspool-bobbins")]);
    let m = messages(&c);
    assert_eq!(m.len(), 1);
    assert!(
        m[0].contains("spool.bobbin_path: /nonexistent/hookspool-bobbins cannot be read"),
        "{m:?}"
    );
}

#[test]
fn embedded_builtins_parse_and_materialise() {
    // Every embedded built-in loads without a problem (a broken one is a build bug).
    let c = Catalog::builtin();
    assert_eq!(messages(&c), Vec::<String>::new());
    assert_eq!(c.entries().len(), embedded::bobbin_dirs().len());
    let home = tempfile::tempdir().unwrap();
    for e in c.entries() {
        let dir =
            embedded::materialise(&e.vendor_dir, &e.product_dir, home.path(), &e.executables())
                .unwrap();
        assert_eq!(
            dir,
            embedded::materialised_dir(&e.vendor_dir, &e.product_dir, home.path())
        );
        for (rel, bytes) in embedded::files_of(&e.vendor_dir, &e.product_dir) {
            assert_eq!(std::fs::read(dir.join(rel)).unwrap(), bytes);
        }
    }
}

#[test]
fn embedded_write_files_is_atomic_idempotent_and_keeps_exec_bits() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("builtin-bobbins/acme/widgets");
    let files: [(&str, &[u8]); 2] = [
        ("bobbin.toml", b"name = \"acme.widgets\"\n"),
        ("bin/processor", b"#!/bin/sh\n"),
    ];
    embedded::write_files(&dir, &files, &["bin/processor"]).unwrap();
    let mode = |rel: &str| {
        std::fs::metadata(dir.join(rel))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!((mode("bobbin.toml"), mode("bin/processor")), (0o644, 0o755));
    assert_eq!(
        std::fs::read(dir.join("bin/processor")).unwrap(),
        b"#!/bin/sh\n"
    );
    // A second run leaves identical files alone (same inode), and repairs a changed one.
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(dir.join("bobbin.toml")).unwrap().ino();
    std::fs::write(dir.join("bin/processor"), "edited").unwrap();
    embedded::write_files(&dir, &files, &["bin/processor"]).unwrap();
    assert_eq!(
        std::fs::metadata(dir.join("bobbin.toml")).unwrap().ino(),
        ino
    );
    assert_eq!(
        std::fs::read(dir.join("bin/processor")).unwrap(),
        b"#!/bin/sh\n"
    );
    assert_eq!(mode("bin/processor"), 0o755);
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("bin"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty());
}
