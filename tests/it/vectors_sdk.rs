//! The CONSTRUCTED vectors checked with the providers' own SDKs (issue 34): a vector whose
//! SOURCE.md says CONSTRUCTED was signed by us, because the provider publishes no signed
//! example, so hookspool accepting it proves only that our signer and our verifier agree.
//! tests/vectors/sdk_check.py feeds each one to the provider's official SDK from PyPI
//! (pinned in tests/vectors/sdk-requirements.txt, installed by .ci/run into a venv) and
//! lists the folders no official SDK can check, with why. These tests run it with that venv's
//! python and hold it to every CONSTRUCTED folder, so a new one cannot slip through.
//!
//! The SDKs that exist only on npm run in tests/vectors/sdk_check.mjs, which the checker
//! starts with `node` from the directory .ci/run installs tests/vectors/sdk-npm into.
//!
//! The venv's python: `HOOKSPOOL_VECTORS_SDK_PYTHON`, else
//! `${XDG_CACHE_HOME:-$HOME/.cache}/hookspool-ci/vectors-sdk/bin/python`; the npm packages:
//! `HOOKSPOOL_VECTORS_SDK_NPM`, else `.../hookspool-ci/vectors-sdk-npm`; `node` from PATH.
//! When any of them is missing the tests skip (a failure under `HOOKSPOOL_NO_SKIP=1`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::bobbins::copy_dir;
use super::intake_oidc::{AUD, GoogleKey, claims};
use super::skip::skip_or_fail;

const PYTHON_ENV: &str = "HOOKSPOOL_VECTORS_SDK_PYTHON";
const NPM_ENV: &str = "HOOKSPOOL_VECTORS_SDK_NPM";

/// The folders the SDKs must check: moving one to the checker's no-SDK list is a decision
/// this test then shows.
const SDK_CHECKED: [&str; 10] = [
    "discord",
    "github",
    "google-pubsub",
    "hubspot",
    "linear",
    "mailgun",
    "shopify",
    "slack",
    "standard-webhooks",
    "stripe",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What the checker runs with: the venv's python and the npm packages' directory.
struct Tools {
    python: PathBuf,
    npm: PathBuf,
}

/// The tools, or why they are not here (the caller skips).
fn sdk_tools() -> Result<Tools, String> {
    let cache = || -> Option<PathBuf> {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("hookspool-ci"))
    };
    let from = |env: &str, default: &str| -> Option<PathBuf> {
        std::env::var_os(env)
            .map(PathBuf::from)
            .or_else(|| cache().map(|c| c.join(default)))
    };
    let runs = |cmd: &Path| {
        Command::new(cmd)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let missing = |what: &str| {
        format!(
            "{what} not installed (.ci/run installs tests/vectors/sdk-requirements.txt and \
             tests/vectors/sdk-npm; or set {PYTHON_ENV} and {NPM_ENV})"
        )
    };
    let python = from(PYTHON_ENV, "vectors-sdk/bin/python")
        .filter(|p| runs(p))
        .ok_or_else(|| missing("the vectors' SDK venv is"))?;
    let npm = from(NPM_ENV, "vectors-sdk-npm")
        .filter(|d| d.join("node_modules").is_dir())
        .ok_or_else(|| missing("the vectors' npm SDKs are"))?;
    if !runs(Path::new("node")) {
        return Err(missing("node is"));
    }
    Ok(Tools { python, npm })
}

/// Folders whose SOURCE.md says CONSTRUCTED, in any case: the rule sdk_check.py applies,
/// read again here so the two cannot drift apart silently.
fn constructed_folders(vectors: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(vectors).unwrap() {
        let source = e.unwrap().path().join("SOURCE.md");
        if let Ok(text) = std::fs::read_to_string(&source)
            && text.to_lowercase().contains("constructed")
        {
            let name = source.parent().unwrap().file_name().unwrap();
            out.insert(name.to_string_lossy().into_owned());
        }
    }
    out
}

/// Runs the checker over `vectors` with a Pub/Sub push token signed the way
/// tests/it/intake_oidc.rs signs the tokens the real intake accepts (its key type and
/// claims), with the key's JWK Set beside it.
fn run_checker(tools: &Tools, vectors: &Path) -> Output {
    let tmp = tempfile::tempdir().unwrap();
    let key = GoogleKey::new("hookspool-vectors-sdk-kid");
    let token = tmp.path().join("token");
    let jwks = tmp.path().join("jwks.json");
    std::fs::write(&token, key.token(&claims())).unwrap();
    std::fs::write(&jwks, serde_json::json!({"keys": [key.jwk()]}).to_string()).unwrap();
    Command::new(&tools.python)
        .arg(repo().join("tests/vectors/sdk_check.py"))
        .arg(vectors)
        .arg("--npm")
        .arg(&tools.npm)
        .arg("--pubsub-token")
        .arg(&token)
        .arg("--pubsub-jwks")
        .arg(&jwks)
        .args(["--pubsub-audience", AUD])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run tests/vectors/sdk_check.py")
}

/// The checker's verdict per folder: `CHECKED <folder> <package>: ...`, `NO-SDK <folder>:
/// <reason>`, `FAIL <folder>: ...`, `NOT-RUN <folder>: ...`.
fn verdicts(stdout: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in stdout.lines() {
        let Some((kind, rest)) = line.split_once(' ') else {
            continue;
        };
        if !["CHECKED", "NO-SDK", "FAIL", "NOT-RUN"].contains(&kind) {
            continue;
        }
        let folder = rest
            .split([' ', ':'])
            .next()
            .unwrap_or_default()
            .to_string();
        let detail = rest[folder.len()..]
            .trim_start_matches(':')
            .trim()
            .to_string();
        out.entry(folder)
            .or_default()
            .push((kind.to_string(), detail));
    }
    out
}

/// Every CONSTRUCTED vector that a provider's SDK can check passes it (accepted, a
/// one-byte-tampered copy refused, a late one refused where the SDK keeps a window), and
/// every other CONSTRUCTED folder is listed with why no official SDK checks it.
#[test]
fn constructed_vectors_pass_the_providers_own_sdks() {
    let tools = match sdk_tools() {
        Ok(t) => t,
        Err(why) => {
            skip_or_fail(&why);
            return;
        }
    };
    let vectors = repo().join("tests/vectors");
    let out = run_checker(&tools, &vectors);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "sdk_check.py failed:\n{stdout}\n{stderr}"
    );

    let got = verdicts(&stdout);
    let constructed = constructed_folders(&vectors);
    assert_eq!(
        got.keys().cloned().collect::<BTreeSet<_>>(),
        constructed,
        "the checker must name every CONSTRUCTED folder and only those:\n{stdout}"
    );
    // tests/vectors/README.md lists every folder and its verdict for readers.
    let readme = std::fs::read_to_string(vectors.join("README.md")).unwrap();
    for (folder, lines) in &got {
        assert!(
            readme.contains(&format!("`{folder}`")),
            "tests/vectors/README.md does not name `{folder}` in its SDK section"
        );
        assert_eq!(lines.len(), 1, "{folder}: one verdict, got {lines:?}");
        let (kind, detail) = &lines[0];
        let want = if SDK_CHECKED.contains(&folder.as_str()) {
            "CHECKED"
        } else {
            "NO-SDK"
        };
        assert_eq!(kind, want, "{folder}: {detail}");
        assert!(
            detail.len() > 20,
            "{folder}: a verdict says what passed or why no SDK checks it: {detail:?}"
        );
        if kind == "CHECKED" {
            // package==version from PyPI, package@version from npm.
            let pkg = detail.split(':').next().unwrap_or_default();
            assert!(
                pkg.contains("==") || pkg.contains('@'),
                "{folder}: names its package and version: {detail}"
            );
        }
    }
}

/// The checker can fail: a vector with one signature digit changed fails its SDK check (a
/// PyPI one, Stripe's, and an npm one, Linear's), and a CONSTRUCTED folder the checker does
/// not know fails the run by name.
#[test]
fn sdk_check_fails_planted_bad_signatures_and_an_unlisted_constructed_folder() {
    let tools = match sdk_tools() {
        Ok(t) => t,
        Err(why) => {
            skip_or_fail(&why);
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let vectors = tmp.path().join("vectors");
    copy_dir(&repo().join("tests/vectors"), &vectors);
    // Stripe's v1: its last hex digit changed.
    let stripe = vectors.join("stripe/vectors.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stripe).unwrap()).unwrap();
    let sig = v["v1"].as_str().unwrap().to_string();
    let last = if sig.ends_with('0') { "1" } else { "0" };
    v["v1"] = format!("{}{last}", &sig[..sig.len() - 1]).into();
    std::fs::write(&stripe, v.to_string()).unwrap();
    // Linear's (checked by its npm SDK): the signature's last hex digit changed.
    let linear = vectors.join("linear/vectors.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&linear).unwrap()).unwrap();
    let sig = v["vectors"][0]["signature"].as_str().unwrap().to_string();
    let last = if sig.ends_with('0') { "1" } else { "0" };
    v["vectors"][0]["signature"] = format!("{}{last}", &sig[..sig.len() - 1]).into();
    std::fs::write(&linear, v.to_string()).unwrap();
    // A new sender whose vector we signed ourselves, in neither of the checker's lists.
    std::fs::create_dir_all(vectors.join("acme")).unwrap();
    std::fs::write(
        vectors.join("acme/SOURCE.md"),
        "# acme/\n\nCONSTRUCTED: signed here with a made-up secret.\n",
    )
    .unwrap();

    let out = run_checker(&tools, &vectors);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let got = verdicts(&stdout);
    let kinds = |f: &str| -> Vec<String> {
        got.get(f)
            .map(|l| l.iter().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default()
    };
    assert!(kinds("stripe").iter().all(|k| k == "FAIL"), "{stdout}");
    assert!(!kinds("stripe").is_empty(), "{stdout}");
    assert!(kinds("linear").iter().all(|k| k == "FAIL"), "{stdout}");
    assert!(!kinds("linear").is_empty(), "{stdout}");
    assert_eq!(kinds("acme"), ["FAIL"], "{stdout}");
    // The rest still pass: the planted faults are what failed.
    assert_eq!(kinds("slack"), ["CHECKED"], "{stdout}");
}
