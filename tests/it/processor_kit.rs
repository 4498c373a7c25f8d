//! The kit's processor row through `hookspool bobbin check` (spec 14.3.5): an exec
//! processor (the broken-processor fixture, fixed) passes; the row fails, and says why, when
//! the processor exits non-zero on a capture, when a `[[stub.fail]]` answer does not give its
//! exit code or is never asked for, when a request has no stub answer, and when no run
//! produces an item. The Google bobbins' own rows are in `bobbins.rs`
//! (`bobbin_check_passes_for_every_builtin`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::bin;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A copy of `from` at `<root>/<vendor>/<product>`.
fn copy_bobbin(from: &Path, root: &Path, vendor: &str, product: &str) -> PathBuf {
    let to = root.join(vendor).join(product);
    copy_dir(from, &to);
    to
}

fn copy_dir(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
            let mode = std::fs::metadata(e.path()).unwrap().permissions().mode();
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} not in {}", path.display());
    std::fs::write(path, text.replace(from, to)).unwrap();
}

/// The processor row of `bobbin check <dir> --report json`: its status and rendered problems.
fn processor_row(dir: &Path) -> (String, Vec<String>) {
    let home = tempfile::tempdir().unwrap();
    let o = Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["bobbin", "check", dir.to_str().unwrap(), "--report", "json"])
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let row = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["row"] == "processor")
        .cloned()
        .unwrap();
    let problems = row["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}:{}: {}",
                p["file"].as_str().unwrap(),
                p["line"],
                p["message"].as_str().unwrap()
            )
        })
        .collect();
    (row["status"].as_str().unwrap().to_string(), problems)
}

fn exec_fixture(root: &Path) -> PathBuf {
    let dir = copy_bobbin(
        &repo().join("tests/fixtures/bobbins/broken-processor/acme/widgets"),
        root,
        "acme",
        "widgets",
    );
    edit(
        &dir.join("processor.sh"),
        "\"event_type\":\"widget.gizmo\"",
        "\"event_type\":\"widget.changed\"",
    );
    dir
}

fn assert_fails_with(dir: &Path, needle: &str) {
    let (status, problems) = processor_row(dir);
    assert_eq!(status, "fail", "{problems:#?}");
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "{needle:?} not in {problems:#?}"
    );
}

#[test]
fn processor_kit_an_exec_processor_with_declared_items_passes() {
    let root = tempfile::tempdir().unwrap();
    let dir = exec_fixture(root.path());
    let (status, problems) = processor_row(&dir);
    assert_eq!(status, "pass", "{problems:#?}");
}

#[test]
fn processor_kit_a_failing_run_an_item_less_kit_and_an_idle_stub_fail_are_findings() {
    // The processor exits 3 on the capture's batch: the runtime's 75.
    let root = tempfile::tempdir().unwrap();
    let dir = exec_fixture(root.path());
    edit(
        &dir.join("processor.sh"),
        "cat > /dev/null\n",
        "cat > /dev/null\nexit 3\n",
    );
    assert_fails_with(
        &dir,
        "captures/accepted.http:7: the processor exited 75 on this capture's batch",
    );

    // Nothing to report: nothing was checked.
    let root = tempfile::tempdir().unwrap();
    let dir = exec_fixture(root.path());
    edit(
        &dir.join("processor.sh"),
        "{\"items\":[{\"event_type\":\"widget.changed\",\"widget\":\"w-1\"},{\"event_type\":\"widget.changed\",\"widget\":\"w-1\"}],",
        "{\"items\":[],",
    );
    assert_fails_with(&dir, "no run of the accepted captures produced an item");

    // A failure run whose answer the processor never asks for tests nothing.
    let root = tempfile::tempdir().unwrap();
    let dir = exec_fixture(root.path());
    let kit = dir.join("captures/kit.toml");
    let mut text = std::fs::read_to_string(&kit).unwrap();
    text.push_str(
        "\n[[stub.fail]]\nexit = 75\nanswer = { path = \"/v1/widgets\", status = 503 }\n",
    );
    std::fs::write(&kit, text).unwrap();
    assert_fails_with(
        &dir,
        "[[stub.fail]] 1: the processor exited 0; this answer must make it exit 75",
    );
    assert_fails_with(&dir, "the processor never asked GET /v1/widgets");
}

#[test]
fn processor_kit_a_missing_answer_and_a_wrong_exit_are_findings_for_a_google_bobbin() {
    let root = tempfile::tempdir().unwrap();
    let dir = copy_bobbin(
        &repo().join("bobbins/google/drive"),
        root.path(),
        "google",
        "drive",
    );
    let kit = dir.join("captures/kit.toml");
    // The second page of changes has no answer; the 400 is said to be a retry.
    edit(
        &kit,
        "query = { pageToken = \"101\" }",
        "query = { pageToken = \"999\" }",
    );
    edit(
        &kit,
        "exit = 65\nanswer = { host = \"www.googleapis.com\", path = \"/drive/v3/changes\", status = 400",
        "exit = 75\nanswer = { host = \"www.googleapis.com\", path = \"/drive/v3/changes\", status = 400",
    );
    let (status, problems) = processor_row(&dir);
    assert_eq!(status, "fail", "{problems:#?}");
    let all = problems.join("\n");
    for needle in [
        "captures/files-update.http:",
        "the processor exited 75 on this capture's batch with the kit's stub answers (provider API answered 501)",
        "the processor asked GET www.googleapis.com/drive/v3/changes and no [[stub.answer]] matches",
        "[[stub.fail]] 3: the processor exited 65 (provider API refused the request (400)); this answer must make it exit 75",
    ] {
        assert!(all.contains(needle), "{needle:?} not in\n{all}");
    }
    // The kit's test secrets never appear in a finding.
    assert!(!all.contains("kit-client-secret-value"), "{all}");
}
