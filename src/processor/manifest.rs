//! The few manifest facts the runtime needs that the env contract does not carry: which
//! processor runs (`[processor] builtin = "google.gmail"` or `exec = "<file in the bobbin>"`),
//! whether it keeps state, and the declared outputs. Read from HOOKSPOOL_BOBBIN_DIR/bobbin.toml
//! with a small private parser that ignores every other table; src/bobbins owns the full
//! manifest type and validation (`hookspool check`), which this will switch to once merged.
//!
//! Must not: accept an exec path that leaves the bobbin's directory.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::ProcessorError;
use super::builtin::Builtin;

/// A manifest larger than this is not a manifest.
const MANIFEST_BYTES_MAX: u64 = 256 * 1024;

#[derive(Debug, Deserialize)]
struct RawManifest {
    processor: Option<RawProcessor>,
    /// A poll bobbin's poller (spec 14.4), run exactly like a processor.
    poll: Option<RawPoll>,
    #[serde(default)]
    outputs: toml::Table,
}

#[derive(Debug, Deserialize)]
struct RawProcessor {
    builtin: Option<String>,
    exec: Option<String>,
    module: Option<String>,
    #[serde(default)]
    state: bool,
    #[serde(default)]
    timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct RawPoll {
    builtin: Option<String>,
    exec: Option<String>,
    module: Option<String>,
    /// A poller keeps its cursor: state defaults to true (14.4).
    #[serde(default = "yes")]
    state: bool,
    #[serde(default)]
    timeout_s: Option<f64>,
}

fn yes() -> bool {
    true
}

/// Which code runs for the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Builtin(Builtin),
    /// An executable inside the bobbin's directory, speaking JSON on stdin and stdout.
    Exec(PathBuf),
}

#[derive(Debug, Clone)]
pub struct ProcessorManifest {
    pub kind: Kind,
    pub state: bool,
    /// The manifest's timeout (the script destination enforces the instance's; an exec
    /// child gets a little less, so the runtime can still report its failure).
    pub timeout_s: f64,
    pub outputs: BTreeSet<String>,
    /// The manifest has `[poll]`: the code is a poller, called once per tick batch.
    pub poll: bool,
}

/// `[processor] timeout_s` when the manifest leaves it out (the script default).
pub const TIMEOUT_S_DEFAULT: f64 = crate::destinations::script::SCRIPT_TIMEOUT_S_DEFAULT;

fn bad(what: &'static str) -> ProcessorError {
    ProcessorError::permanent(format!("bobbin.toml: {what}"))
}

/// Reads `<dir>/bobbin.toml`.
pub fn read(dir: &Path) -> Result<ProcessorManifest, ProcessorError> {
    let path = dir.join("bobbin.toml");
    let meta = std::fs::metadata(&path).map_err(|_| bad("cannot be read"))?;
    if meta.len() > MANIFEST_BYTES_MAX {
        return Err(bad("is too large"));
    }
    let text = std::fs::read_to_string(&path).map_err(|_| bad("cannot be read"))?;
    parse(dir, &text)
}

fn parse(dir: &Path, text: &str) -> Result<ProcessorManifest, ProcessorError> {
    let raw: RawManifest = toml::from_str(text).map_err(|_| bad("is not valid TOML"))?;
    let (p, poll) = match (raw.processor, raw.poll) {
        (Some(p), None) => (p, false),
        (None, Some(q)) => (
            RawProcessor {
                builtin: q.builtin,
                exec: q.exec,
                module: q.module,
                state: q.state,
                timeout_s: q.timeout_s,
            },
            true,
        ),
        (None, None) => return Err(bad("has no [processor] or [poll] table")),
        (Some(_), Some(_)) => return Err(bad("has both [processor] and [poll]")),
    };
    let kind = match (p.builtin, p.exec, p.module) {
        (Some(name), None, None) => Kind::Builtin(
            Builtin::from_name(&name).ok_or(bad("names an unknown builtin processor"))?,
        ),
        (None, Some(file), None) => Kind::Exec(exec_path(dir, &file)?),
        (None, None, Some(_)) => {
            return Err(bad(
                "[processor] module is the Python runtime's; write exec = \"<file>\" for an executable",
            ));
        }
        _ => return Err(bad("[processor] needs exactly one of builtin or exec")),
    };
    Ok(ProcessorManifest {
        kind,
        state: p.state,
        timeout_s: p
            .timeout_s
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(TIMEOUT_S_DEFAULT),
        outputs: raw.outputs.keys().cloned().collect(),
        poll,
    })
}

/// A relative path of normal components, resolved inside the bobbin's directory.
fn exec_path(dir: &Path, file: &str) -> Result<PathBuf, ProcessorError> {
    let rel = Path::new(file);
    let plain = !file.is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(bad(
            "[processor] exec must be a file inside the bobbin's directory",
        ));
    }
    Ok(dir.join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_and_exec_processors_parse() {
        let m = parse(
            Path::new("/b"),
            "name = \"google.gmail\"\n[processor]\nbuiltin = \"google.gmail\"\nstate = true\ntimeout_s = 300\n[outputs.mail]\ndescription = \"x\"\n",
        )
        .unwrap();
        assert_eq!(m.kind, Kind::Builtin(Builtin::GoogleGmail));
        assert!(m.state && m.outputs.contains("mail"));
        let m = parse(Path::new("/b"), "[processor]\nexec = \"bin/p.py\"\n").unwrap();
        assert_eq!(m.kind, Kind::Exec(PathBuf::from("/b/bin/p.py")));
        assert!(!m.state);
    }

    #[test]
    fn the_google_bobbins_name_their_builtin_processor_with_state() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("bobbins/google");
        for (product, builtin, outputs) in [
            ("gmail", Builtin::GoogleGmail, &["mail", "scheduling"][..]),
            ("calendar", Builtin::GoogleCalendar, &["changed"][..]),
            ("drive", Builtin::GoogleDrive, &["changed"][..]),
        ] {
            let m = read(&root.join(product)).unwrap();
            assert_eq!(m.kind, Kind::Builtin(builtin), "{product}");
            assert!(m.state, "{product} keeps state");
            let declared: Vec<&str> = m.outputs.iter().map(String::as_str).collect();
            assert_eq!(declared, outputs, "{product}");
        }
    }

    #[test]
    fn an_exec_outside_the_bobbin_or_an_unknown_builtin_is_refused() {
        for bad in [
            "[processor]\nexec = \"../x\"\n",
            "[processor]\nexec = \"/bin/sh\"\n",
            "[processor]\nbuiltin = \"google.nope\"\n",
            "[processor]\nbuiltin = \"google.gmail\"\nexec = \"p\"\n",
            "[processor]\nmodule = \"processor\"\n",
            "name = \"x\"\n",
        ] {
            assert!(parse(Path::new("/b"), bad).is_err(), "{bad}");
        }
    }
}
