//! The few manifest facts the runtime needs that the env contract does not carry: which
//! processor runs (`[processor] builtin = "google.gmail"` or `exec = "<file in the bobbin>"`,
//! or a `[poll]` bobbin's poller), whether it keeps state, its timeout, and the declared
//! outputs. Read from HOOKSPOOL_BOBBIN_DIR/bobbin.toml through the one manifest type,
//! `bobbins::Manifest::parse` (the same validation as `hookspool check` and config loading),
//! so the runtime and the kit can never read a manifest differently.
//!
//! Must not: accept an exec path that leaves the bobbin's directory.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use super::ProcessorError;
use super::builtin::Builtin;
use crate::bobbins::manifest::{Body, Manifest, ProcessorImpl};

/// A manifest larger than this is not a manifest.
const MANIFEST_BYTES_MAX: u64 = 256 * 1024;

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
    let m = Manifest::parse(text).map_err(|problems| {
        ProcessorError::permanent(format!(
            "bobbin.toml: {}; run hookspool bobbin check on the bobbin",
            problems
                .first()
                .map(|p| format!("line {}: {}", p.line, p.message))
                .unwrap_or_else(|| "invalid".into())
        ))
    })?;
    let (imp, state, timeout_s, poll) = match &m.body {
        Body::Poll(p) => (&p.imp, p.state, p.timeout_s, true),
        Body::Push {
            processor: Some(p), ..
        } => (&p.imp, p.state, p.timeout_s, false),
        Body::Push {
            processor: None, ..
        } => return Err(bad("has no [processor] or [poll] table")),
    };
    let kind = match imp {
        ProcessorImpl::Builtin(name) => Kind::Builtin(
            Builtin::from_name(name).ok_or(bad("names an unknown builtin processor"))?,
        ),
        ProcessorImpl::Exec(file) => Kind::Exec(exec_path(dir, file)?),
    };
    Ok(ProcessorManifest {
        kind,
        state,
        timeout_s: if timeout_s > 0 {
            timeout_s as f64
        } else {
            TIMEOUT_S_DEFAULT
        },
        outputs: m.outputs.keys().map(|k| k.as_str().to_string()).collect(),
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

    /// The kit fixture's exec processor bobbin (a complete manifest).
    fn exec_fixture() -> String {
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/bobbins/broken-processor/acme/widgets/bobbin.toml"),
        )
        .unwrap()
    }

    #[test]
    fn builtin_and_exec_processors_parse() {
        let text = exec_fixture();
        let m = parse(Path::new("/b"), &text).unwrap();
        assert_eq!(m.kind, Kind::Exec(PathBuf::from("/b/processor.sh")));
        assert!(m.state && !m.poll);
        assert_eq!(m.timeout_s, 30.0);
        assert!(m.outputs.contains("widget.changed"), "{:?}", m.outputs);
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
        let good = exec_fixture();
        let line = "exec = \"processor.sh\"";
        assert!(good.contains(line));
        for bad in [
            "exec = \"../x\"",
            "exec = \"/bin/sh\"",
            "builtin = \"google.nope\"",
            "builtin = \"google.gmail\"\nexec = \"p\"",
            "module = \"processor\"",
        ] {
            let text = good.replace(line, bad);
            assert!(parse(Path::new("/b"), &text).is_err(), "{bad}");
        }
        let no_processor = good.replace("[processor]\n", "[nothing]\n");
        assert!(parse(Path::new("/b"), &no_processor).is_err());
    }
}
