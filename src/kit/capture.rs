//! The conformance captures of a bobbin: `captures/<name>.http` and `captures/kit.toml`
//! (spec 14.3.1, 14.3.5).
//!
//! A capture is zero or more directive lines, then the request exactly as
//! `sources::parse_capture` reads it (request line, headers, blank line, body):
//!
//! ```text
//! # source: GitHub docs, "Validating webhook deliveries", the test vector
//! # at: 1700000000
//! # expect: verdict = "accepted"
//! # expect: status = 200
//! # expect: key = "octo/hello:ci"
//! # expect: attrs.repo = "octo/hello"
//! # expect: body.status = "queued"
//! POST /hooks/github HTTP/1.1
//! ...
//! ```
//!
//! Directives: `# expect: <what> = <TOML value>` where `<what>` is `verdict` (one of
//! [`Verdict`]), `status` (the HTTP status the intake answers), `key`, `event_type`,
//! `dedup_id`, `attrs.<name>` (strings) or `body.<dot.path>` (any value in the JSON answer
//! body); `# at: <unix seconds>` (the capture's own time, for timestamped schemes);
//! `# source: <one line>` (where the capture came from). Other `# ...` lines and blank lines
//! before the request line are comments.
//!
//! `captures/kit.toml` is [`KitFile`]: `instance` (captures go to `/hooks/<instance>`),
//! `[bobbin]` (the `[bobbins.<instance>]` table as an operator writes it, minus secrets),
//! `[secrets]` (test values: published test vectors' keys or made-up keys, never real ones)
//! and `[stub]` ([`Stub`]: Plaid's key-service answer for the source kit; the processor's
//! starting state, its stub HTTP answers and failure runs for the processor row):
//!
//! ```toml
//! [stub]
//! state = { history_id = "1000" }     # the processor's state before each run
//!
//! [[stub.answer]]                     # each request takes the first unused answer whose
//! method = "GET"                      # method, host and path match and whose query holds
//! host = "gmail.googleapis.com"       # every `query` pair; `repeat = true` answers every
//! path = "/gmail/v1/users/me/history" # match; status defaults to 200, `body` is JSON
//! query = { startHistoryId = "1000" }
//! body = { historyId = "1010" }
//!
//! [[stub.fail]]                       # one more run of the first accepted capture, this
//! exit = 75                           # answer before all others (once): the runtime must
//! answer = { path = "/gmail/v1/users/me/history", status = 503 }   # exit with `exit`
//! ```
//!
//! Owns: parsing both formats with line numbers. Must not: run a capture through a source
//! (that is the source-kit row), or print a secret value.

use std::collections::BTreeMap;

use crate::bobbins::Finding;

/// The file holding the kit's instance and test values.
pub const KIT_FILE: &str = "kit.toml";

/// What the intake does with a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    Unauthorized,
    Ignored,
    Challenge,
    Quarantined,
    TooLarge,
    Chunked,
}

impl Verdict {
    pub const ALL: [Verdict; 7] = [
        Verdict::Accepted,
        Verdict::Unauthorized,
        Verdict::Ignored,
        Verdict::Challenge,
        Verdict::Quarantined,
        Verdict::TooLarge,
        Verdict::Chunked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Unauthorized => "unauthorized",
            Verdict::Ignored => "ignored",
            Verdict::Challenge => "challenge",
            Verdict::Quarantined => "quarantined",
            Verdict::TooLarge => "too_large",
            Verdict::Chunked => "chunked",
        }
    }

    fn parse(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// One `# expect:` line.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    Verdict(Verdict),
    Status(u16),
    Key(String),
    EventType(String),
    DedupId(String),
    Attr(String, String),
    /// A dot path into the JSON answer body, and the value expected there.
    Body(Vec<String>, toml::Value),
}

/// A parsed capture file.
#[derive(Debug, Clone, PartialEq)]
pub struct Capture {
    /// (expectation, 1-based line).
    pub expects: Vec<(Expect, usize)>,
    /// `# at:`: unix seconds.
    pub at: Option<i64>,
    /// `# source:`.
    pub source: Option<String>,
    /// The request text (request line onwards), for `sources::parse_capture`.
    pub request: String,
    /// The line the request starts on.
    pub request_line: usize,
}

impl Capture {
    pub fn verdict(&self) -> Option<Verdict> {
        self.expects.iter().find_map(|(e, _)| match e {
            Expect::Verdict(v) => Some(*v),
            _ => None,
        })
    }

    /// Parses a capture; `file` names it in the findings.
    pub fn parse(file: &str, text: &str) -> Result<Capture, Vec<Finding>> {
        let mut expects = Vec::new();
        let mut at = None;
        let mut source = None;
        let mut problems = Vec::new();
        let mut offset = 0;
        let mut request_line = 0;
        for (i, line) in text.split_inclusive('\n').enumerate() {
            let n = i + 1;
            let trimmed = line.trim_end_matches(['\n', '\r']);
            if let Some(rest) = trimmed.strip_prefix('#') {
                let rest = rest.trim_start();
                if let Some(e) = rest.strip_prefix("expect:") {
                    match parse_expect(e.trim()) {
                        Ok(x) => expects.push((x, n)),
                        Err(m) => problems.push(Finding::new(file, n, m)),
                    }
                } else if let Some(t) = rest.strip_prefix("at:") {
                    match t.trim().parse::<i64>() {
                        Ok(v) if v >= 0 => at = Some(v),
                        _ => problems.push(Finding::new(
                            file,
                            n,
                            "write # at: <unix seconds>, e.g. # at: 1700000000",
                        )),
                    }
                } else if let Some(s) = rest.strip_prefix("source:") {
                    source = Some(s.trim().to_string());
                }
                offset += line.len();
                continue;
            }
            if trimmed.trim().is_empty() {
                offset += line.len();
                continue;
            }
            request_line = n;
            break;
        }
        if request_line == 0 {
            problems.push(Finding::new(file, text.lines().count().max(1), "no request after the directives; write the request line, e.g. POST /hooks/<instance> HTTP/1.1, then headers, a blank line and the body"));
        }
        let mut verdicts = expects
            .iter()
            .filter(|(e, _)| matches!(e, Expect::Verdict(_)));
        match (verdicts.next(), verdicts.next()) {
            (None, _) if problems.is_empty() => problems.push(Finding::new(file, 1, format!("say what the intake does with it; add # expect: verdict = \"accepted\" (one of {})", Verdict::ALL.map(Verdict::as_str).join(", ")))),
            (Some(_), Some((_, n))) => problems.push(Finding::new(file, *n, "one verdict per capture; remove this line")),
            _ => {}
        }
        if source.as_deref().is_none_or(str::is_empty) && problems.is_empty() {
            problems.push(Finding::new(file, 1, "say where the capture came from; add # source: <the provider's docs page or test vector, and what was redacted>"));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Capture {
            expects,
            at,
            source,
            request: text[offset..].to_string(),
            request_line,
        })
    }
}

fn parse_expect(text: &str) -> Result<Expect, String> {
    let Some((lhs, rhs)) = text.split_once('=') else {
        return Err(
            "write # expect: <what> = <TOML value>, e.g. # expect: verdict = \"accepted\"".into(),
        );
    };
    let lhs = lhs.trim();
    let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {}", rhs.trim()))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .ok_or_else(|| {
            format!(
                "{} is not a TOML value; quote strings: # expect: {lhs} = \"...\"",
                rhs.trim()
            )
        })?;
    let string = |what: &str| -> Result<String, String> {
        value
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{what} is a string; write # expect: {lhs} = \"...\""))
    };
    match lhs {
        "verdict" => {
            let s = string("verdict")?;
            Verdict::parse(&s).map(Expect::Verdict).ok_or_else(|| {
                format!(
                    "{s:?} is not a verdict; write one of {}",
                    Verdict::ALL.map(Verdict::as_str).join(", ")
                )
            })
        }
        "status" => match value.as_integer() {
            Some(s) if (100..=599).contains(&s) => Ok(Expect::Status(s as u16)),
            _ => Err("status is an HTTP status; write # expect: status = 200".into()),
        },
        "key" => string("key").map(Expect::Key),
        "event_type" => string("event_type").map(Expect::EventType),
        "dedup_id" => string("dedup_id").map(Expect::DedupId),
        _ => {
            if let Some(name) = lhs.strip_prefix("attrs.").filter(|n| !n.is_empty()) {
                return string("an attribute").map(|v| Expect::Attr(name.to_string(), v));
            }
            if let Some(path) = lhs.strip_prefix("body.").filter(|p| !p.is_empty()) {
                return Ok(Expect::Body(
                    path.split('.').map(str::to_string).collect(),
                    value,
                ));
            }
            Err(format!(
                "{lhs:?} is not an expectation; write one of verdict, status, key, event_type, dedup_id, attrs.<name>, body.<path>"
            ))
        }
    }
}

/// `captures/kit.toml`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KitFile {
    /// The kit's instance name; captures go to `/hooks/<instance>`.
    pub instance: String,
    /// The `[bobbins.<instance>]` table, minus secrets.
    pub bobbin: toml::Table,
    /// Test values for the instance's secrets.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    /// Stub answers: Plaid's key service, the processor's state and HTTP answers.
    #[serde(default)]
    pub stub: Stub,
}

/// `[stub]` of kit.toml (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stub {
    /// The JWK Plaid's key service answers for the captures' kid (the source kit).
    pub webhook_verification_key: Option<toml::Value>,
    /// The processor's state before each run, as earlier batches would have left it.
    #[serde(default)]
    pub state: toml::Table,
    /// The provider API's answers to the processor's requests.
    #[serde(default)]
    pub answer: Vec<StubAnswer>,
    /// Failure runs: an answer put first, and the exit code the runtime must give.
    #[serde(default)]
    pub fail: Vec<StubFail>,
}

/// One stub HTTP answer and the requests it matches.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StubAnswer {
    #[serde(default = "default_method")]
    pub method: String,
    /// The provider's host (`gmail.googleapis.com`); any host when left out.
    pub host: Option<String>,
    /// The URL's path, exactly.
    pub path: String,
    /// Query parameters the request must carry (others may be there too).
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Answers every matching request, not only the first.
    #[serde(default)]
    pub repeat: bool,
    #[serde(default = "default_status")]
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The JSON body, written as TOML; none is an empty body.
    pub body: Option<toml::Value>,
}

/// One failure run of the processor row.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StubFail {
    /// The exit code `hookspool processor` must give: 75 (retry), 78 (config) or 65.
    pub exit: i32,
    pub answer: StubAnswer,
}

fn default_method() -> String {
    "GET".to_string()
}

fn default_status() -> u16 {
    200
}

impl KitFile {
    /// The config the kit instance is loaded from: `[bobbins.<instance>]` with the kit's
    /// table and each of its secrets as `{ file = secret_file(name) }` (references only: the
    /// caller writes the files, or keeps them as the reserved kit paths).
    pub fn config_root(&self, secret_file: impl Fn(&str) -> String) -> toml::Table {
        let mut instance = self.bobbin.clone();
        let refs: toml::Table = self
            .secrets
            .keys()
            .map(|n| {
                let r = toml::Table::from_iter([(
                    "file".to_string(),
                    toml::Value::String(secret_file(n)),
                )]);
                (n.clone(), toml::Value::Table(r))
            })
            .collect();
        if !refs.is_empty() {
            instance.insert("secrets".into(), toml::Value::Table(refs));
        }
        let bobbins =
            toml::Table::from_iter([(self.instance.clone(), toml::Value::Table(instance))]);
        toml::Table::from_iter([("bobbins".to_string(), toml::Value::Table(bobbins))])
    }

    pub fn parse(file: &str, text: &str) -> Result<KitFile, Finding> {
        toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .unwrap_or(1);
            Finding::new(file, line, format!("{}; kit.toml holds instance = \"<name>\", [bobbin] (the instance table without secrets), [secrets] (test values) and [stub]", e.message()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# source: GitHub docs test vector\n# at: 1700000000\n# expect: verdict = \"accepted\"\n# expect: status = 200\n# expect: key = \"octo/hello:ci\"\n# expect: attrs.repo = \"octo/hello\"\n# expect: body.status = \"queued\"\n# a comment\n\nPOST /hooks/github HTTP/1.1\nContent-Length: 2\n\n{}";

    #[test]
    fn capture_directives_parse() {
        let c = Capture::parse("captures/push.http", GOOD).expect("parse");
        assert_eq!(c.verdict(), Some(Verdict::Accepted));
        assert_eq!(c.at, Some(1_700_000_000));
        assert_eq!(c.request_line, 10);
        assert!(c.request.starts_with("POST /hooks/github"));
        assert!(
            c.expects
                .iter()
                .any(|(e, n)| *e == Expect::Status(200) && *n == 4)
        );
        assert!(
            c.expects
                .iter()
                .any(|(e, _)| *e == Expect::Attr("repo".into(), "octo/hello".into()))
        );
        assert!(c.expects.iter().any(|(e, _)| matches!(e, Expect::Body(p, v) if p == &["status"] && v.as_str() == Some("queued"))));
        let req = crate::sources::parse_capture(&c.request, 0.0).expect("request");
        assert_eq!(req.body, b"{}");
    }

    #[test]
    fn capture_bad_directives_name_their_line() {
        let bad = GOOD.replace("verdict = \"accepted\"", "verdict = \"fine\"");
        let e = Capture::parse("c.http", &bad).unwrap_err();
        assert_eq!(e[0].line, 3);
        assert!(e[0].message.contains("accepted, unauthorized"), "{}", e[0]);
        let bad = GOOD.replace("status = 200", "status = \"200\"");
        assert_eq!(Capture::parse("c.http", &bad).unwrap_err()[0].line, 4);
        let bad = GOOD.replace("key = \"octo/hello:ci\"", "key = octo");
        assert!(
            Capture::parse("c.http", &bad).unwrap_err()[0]
                .message
                .contains("TOML value")
        );
        let bad = GOOD.replace("# expect: key", "# expect: colour");
        assert!(
            Capture::parse("c.http", &bad).unwrap_err()[0]
                .message
                .contains("not an expectation")
        );
        let bad = GOOD.replace("# at: 1700000000", "# at: soon");
        assert_eq!(Capture::parse("c.http", &bad).unwrap_err()[0].line, 2);
    }

    #[test]
    fn capture_needs_verdict_source_and_request() {
        let no_verdict = GOOD.replace("# expect: verdict = \"accepted\"\n", "");
        assert!(
            Capture::parse("c.http", &no_verdict).unwrap_err()[0]
                .message
                .contains("verdict")
        );
        let no_source = GOOD.replace("# source: GitHub docs test vector\n", "");
        assert!(
            Capture::parse("c.http", &no_source).unwrap_err()[0]
                .message
                .contains("source")
        );
        assert!(
            Capture::parse("c.http", "# source: x\n# expect: verdict = \"accepted\"\n")
                .unwrap_err()[0]
                .message
                .contains("request")
        );
    }

    #[test]
    fn kit_file_parses_and_refuses_unknown_keys() {
        let k = KitFile::parse("kit.toml", "instance = \"github\"\n[bobbin]\nbobbin = \"github.repo\"\noutputs = { \"*\" = \"hermes:github\" }\n[secrets]\nsecret = \"It's a Secret to Everybody\"\n").expect("kit");
        assert_eq!(k.instance, "github");
        assert_eq!(k.secrets["secret"], "It's a Secret to Everybody");
        let e = KitFile::parse("kit.toml", "instance = \"x\"\n[bobbin]\n[extra]\n").unwrap_err();
        assert_eq!(e.line, 3);
    }

    #[test]
    fn kit_file_stub_answers_and_failure_runs_parse_with_defaults() {
        let k = KitFile::parse(
            "kit.toml",
            "instance = \"x\"\n[bobbin]\n[stub]\nstate = { cursor = \"1\" }\n[[stub.answer]]\npath = \"/v1/items\"\nbody = { items = [] }\n[[stub.fail]]\nexit = 75\nanswer = { method = \"POST\", path = \"/v1/items\", status = 503 }\n",
        )
        .expect("kit");
        assert_eq!(k.stub.state["cursor"].as_str(), Some("1"));
        let a = &k.stub.answer[0];
        assert_eq!((a.method.as_str(), a.status, a.repeat), ("GET", 200, false));
        assert_eq!(k.stub.fail[0].exit, 75);
        assert_eq!(k.stub.fail[0].answer.status, 503);
        let e = KitFile::parse(
            "kit.toml",
            "instance = \"x\"\n[bobbin]\n[[stub.answer]]\npath = \"/a\"\nstatuss = 1\n",
        )
        .unwrap_err();
        assert!(e.message.contains("unknown field `statuss`"), "{e:?}");
    }
}
