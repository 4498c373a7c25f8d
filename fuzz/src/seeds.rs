//! The seed corpora, made from the source kit (every built-in source and template kit, each
//! request signed as the kit signs it) and from the repository's own config files, so each
//! target starts from inputs that reach deep. `cargo test -- --ignored write_seeds` (run in
//! this directory) rewrites the generated seeds under corpus/; the hand-made and extracted
//! ones (names not starting with `kit-`) are left alone. The committed seeds are what CI and
//! `run.sh` start from; a test below checks that the signed ones still verify, so a kit
//! change at merge shows up as a test failure rather than as a weaker corpus.

use std::path::{Path, PathBuf};

use hookspool::kit::signer::{KIT_NOW, Kit, TEMPLATE_KITS, all_kits};
use hookspool::sources::Request;

use crate::{Credentials, FUZZ_SECRET, FlowControl};

/// The committed corpus directory of a target.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// A request as a `.http` capture's head (request line and headers, no blank line).
pub fn capture_head(r: &Request) -> String {
    let mut target = r.path.clone();
    for (i, (k, v)) in r.query.iter().enumerate() {
        target.push(if i == 0 { '?' } else { '&' });
        target.push_str(&format!("{k}={v}"));
    }
    let mut head = format!("{} {target} HTTP/1.1\r\nHost: hooks.example.org", r.method);
    for (k, v) in &r.headers {
        head.push_str(&format!("\r\n{k}: {v}"));
    }
    head
}

/// A whole capture: head, Content-Length, blank line, body.
pub fn capture(r: &Request) -> Vec<u8> {
    let mut out = capture_head(r).into_bytes();
    out.extend_from_slice(format!("\r\nContent-Length: {}\r\n\r\n", r.body.len()).as_bytes());
    out.extend_from_slice(&r.body);
    out
}

/// A `source_flow` input for kit `kit` of the matrix.
pub fn flow_input(
    kit: usize,
    credentials: Credentials,
    head: bool,
    skew_s: i16,
    r: &Request,
) -> Vec<u8> {
    let ctl = FlowControl {
        kit,
        credentials,
        head,
        credentials_first: false,
        skew_s,
    };
    let mut out = ctl.encode().to_vec();
    out.extend_from_slice(capture_head(r).as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(&r.body);
    out
}

fn label(kit: &Kit) -> String {
    kit.label.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
}

/// Every generated seed: (target, file name, bytes).
pub fn generated() -> Vec<(&'static str, String, Vec<u8>)> {
    let kits = all_kits(FUZZ_SECRET).expect("the kit builds every source");
    let mut out = Vec::new();
    for (i, kit) in kits.iter().enumerate() {
        let l = label(kit);
        let body = &kit.sample_body;
        let signed = kit.signed(body, KIT_NOW);
        out.push(("capture", format!("kit-{l}.http"), capture(&signed)));
        out.push((
            "capture",
            format!("kit-{l}-unsigned.http"),
            capture(&kit.unsigned(body, KIT_NOW)),
        ));
        // Past the kit's own window (the template kits' tolerance_s differs from 300 s).
        let stale_s = i16::try_from(kit.tolerance_s + 100).unwrap_or(i16::MAX);
        let flows = [
            ("signed", Credentials::Signed, false, 0, &signed),
            ("as-is", Credentials::AsIs, false, 0, &signed),
            ("stripped", Credentials::Stripped, false, 0, &signed),
            ("wrong", Credentials::WrongSecret, false, 0, &signed),
            ("stale", Credentials::Signed, false, stale_s, &signed),
        ];
        for (what, c, head, skew, r) in flows {
            out.push((
                "source_flow",
                format!("kit-{l}-{what}"),
                flow_input(i, c, head, skew, r),
            ));
        }
        if let Some(h) = kit.handshake(true, KIT_NOW) {
            let head = h.method == "HEAD";
            out.push((
                "source_flow",
                format!("kit-{l}-handshake"),
                flow_input(i, Credentials::AsIs, head, 0, &h),
            ));
            out.push(("capture", format!("kit-{l}-handshake.http"), capture(&h)));
        }
    }
    // Selectors: every value and rule the template kits configure, with the kit's body.
    let body = br#"{"id":"evt_1","type":"thing.happened","repository":{"full_name":"octo/kit"},"events":[{"id":7}],"n":1.5,"ok":true,"nil":null}"#;
    let mut n = 0;
    for (_, options) in TEMPLATE_KITS {
        let table: toml::Table = options.parse().expect("kit options are TOML");
        let mut values = Vec::new();
        for (k, v) in &table {
            match v {
                toml::Value::String(s) if k != "scheme" && k != "header" && k != "prefix" => {
                    values.push(s.clone())
                }
                toml::Value::Array(a) => {
                    values.extend(a.iter().filter_map(|x| x.as_str().map(str::to_string)))
                }
                toml::Value::Table(t) => {
                    values.extend(t.values().filter_map(|x| x.as_str().map(str::to_string)))
                }
                _ => {}
            }
        }
        for v in values {
            n += 1;
            let mut seed = v.into_bytes();
            seed.extend_from_slice(b"\0X-Event: thing.happened\0");
            seed.extend_from_slice(body);
            out.push(("select", format!("kit-{n:02}"), seed));
        }
    }
    // Config: each template kit as a configured source with a route and a destination.
    for (name, options) in TEMPLATE_KITS {
        let text = format!(
            "[sources.{name}]\ntype = \"template\"\naction = \"http-main\"\nsecrets.secret = {{ file = \"/etc/hookspool/secrets/{name}\" }}\n{options}\n\n[[routes]]\nname = \"{name}-tee\"\nsource = \"{name}\"\ntee = true\ndestination = \"http-main\"\n\n[destinations.http-main]\ntype = \"http\"\nurl = \"https://hooks.example.org/in\"\n"
        );
        out.push(("config", format!("kit-{name}.toml"), text.into_bytes()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookspool::sources::{Verdict, evaluate};

    #[test]
    #[ignore = "writes the generated seeds into corpus/; run by hand after a kit change"]
    fn write_seeds() {
        for (target, name, bytes) in generated() {
            let dir = corpus_dir(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn the_committed_signed_seeds_still_verify() {
        let kits = all_kits(FUZZ_SECRET).expect("kits");
        let mut checked = 0;
        for entry in std::fs::read_dir(corpus_dir("source_flow")).expect("corpus") {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !(name.starts_with("kit-") && name.ends_with("-signed")) {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            let (ctl, rest) = FlowControl::decode(&data, kits.len()).expect("control bytes");
            let kit = &kits[ctl.kit];
            let (head, body) = crate::head_and_body(rest);
            let mut r = crate::request_from(head, body, KIT_NOW).expect("a capture");
            let t = kit.request(&r.body, KIT_NOW, KIT_NOW);
            crate::splice_credentials(kit, &mut r, &t, false);
            let v = evaluate(kit.source.as_ref(), &r, &kit.secrets);
            assert!(
                matches!(v, Verdict::Accept(_)),
                "{name} ({}): {v:?}",
                kit.label
            );
            checked += 1;
        }
        assert!(checked >= kits.len(), "only {checked} signed seeds");
    }
}
