//! The soak's spool home: secrets (the http destinations' and one source's `whsec_` secrets
//! made by `hookspool secret new`), and a config of three sources over three signature
//! schemes, immediate and coalescing windows, a tee route, and four http destinations on
//! the flapping receiver. The routes' bounds are stated once here ([`ROUTES`]) and both the
//! config and the checker read them.

use std::path::Path;
use std::process::{Command, Stdio};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::load::{Scheme, SourceLoad};
use super::verdict::RouteBound;

/// Each route the soak configures: (route, source, destination, quiet_s, max_s, max_events,
/// max_bytes, tee).
pub struct RouteSpec {
    pub route: &'static str,
    pub source: &'static str,
    pub destination: &'static str,
    pub quiet_s: f64,
    pub max_s: f64,
    pub max_events: usize,
    pub max_bytes: usize,
    pub tee: bool,
}

pub const ROUTES: &[RouteSpec] = &[
    // Immediate, with a small event bound so bursts also seal by size.
    RouteSpec {
        route: "alpha",
        source: "alpha",
        destination: "recv-alpha",
        quiet_s: 0.0,
        max_s: 0.0,
        max_events: 8,
        max_bytes: 16384,
        tee: false,
    },
    // Coalescing on a quiet window and a maximum wait.
    RouteSpec {
        route: "beta",
        source: "beta",
        destination: "recv-beta",
        quiet_s: 2.0,
        max_s: 6.0,
        max_events: 25,
        max_bytes: 65536,
        tee: false,
    },
    // Coalescing bounded by bytes (events are 0.2 to 1.5 KB).
    RouteSpec {
        route: "gamma",
        source: "gamma",
        destination: "recv-gamma",
        quiet_s: 1.0,
        max_s: 4.0,
        max_events: 200,
        max_bytes: 6000,
        tee: false,
    },
    // A tee copy of every gamma event, immediate, at most three per batch.
    RouteSpec {
        route: "gamma-audit",
        source: "gamma",
        destination: "recv-audit",
        quiet_s: 0.0,
        max_s: 0.0,
        max_events: 3,
        max_bytes: 3000,
        tee: true,
    },
];

/// The destination's timeout; the receiver's slow answers take longer.
pub const DESTINATION_TIMEOUT_S: f64 = 2.0;
/// Free-space guard of the intake (limits.min_free_bytes).
pub const MIN_FREE_BYTES: u64 = 2 << 20;

pub fn bounds() -> Vec<RouteBound> {
    ROUTES
        .iter()
        .map(|r| RouteBound {
            route: r.route.into(),
            source: r.source.into(),
            max_events: r.max_events,
            max_bytes: r.max_bytes,
        })
        .collect()
}

/// The secrets of a home, made before the receiver starts (it checks the destinations'
/// signatures with the receiver secret).
pub struct Secrets {
    pub receiver: String,
    pub sources: Vec<SourceLoad>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Run a `hookspool` command on `home`; its output when it succeeds.
pub fn hookspool(bin: &Path, home: &Path, args: &[&str]) -> Result<String, BoxError> {
    let out = Command::new(bin)
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .stdin(Stdio::null())
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "hookspool {}: {}: {}",
            args.join(" "),
            out.status,
            text.trim()
        )
        .into())
    }
}

fn write_private(path: &Path, value: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(value.as_bytes())
}

/// Make the home's secrets: two `whsec_` secrets by `hookspool secret new` (the http
/// destinations' and the Standard Webhooks source's) and two raw ones (seeded, so a replay
/// signs the same way) for the template sources.
pub fn secrets(bin: &Path, home: &Path, seed: u64) -> Result<Secrets, BoxError> {
    use std::os::unix::fs::DirBuilderExt;
    let secrets = home.join("secrets");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&secrets)?;
    let receiver = secrets.join("receiver");
    let beta = secrets.join("beta");
    hookspool(bin, home, &["secret", "new", &receiver.to_string_lossy()])?;
    hookspool(bin, home, &["secret", "new", &beta.to_string_lossy()])?;
    let receiver_secret = std::fs::read_to_string(&receiver)?.trim().to_string();
    let beta_key = STANDARD.decode(
        std::fs::read_to_string(&beta)?
            .trim()
            .strip_prefix("whsec_")
            .ok_or("secret new did not write a whsec_ secret")?,
    )?;
    let alpha_secret = format!("soak-alpha-{seed:016x}");
    let gamma_secret = format!("soak-gamma-{seed:016x}");
    write_private(&secrets.join("alpha"), &alpha_secret)?;
    write_private(&secrets.join("gamma"), &gamma_secret)?;

    let keys = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    let sources = vec![
        SourceLoad {
            name: "alpha".into(),
            scheme: Scheme::HexSha256 {
                header: "X-Signature",
            },
            key: alpha_secret.into_bytes(),
            keys: keys("a", 5),
            pad: (20, 400),
        },
        SourceLoad {
            name: "beta".into(),
            scheme: Scheme::StandardWebhooks,
            key: beta_key,
            keys: keys("b", 4),
            pad: (20, 400),
        },
        SourceLoad {
            name: "gamma".into(),
            scheme: Scheme::Timestamped {
                header: "X-Gamma-Signature",
            },
            key: gamma_secret.into_bytes(),
            keys: keys("g", 3),
            pad: (200, 1500),
        },
    ];
    Ok(Secrets {
        receiver: receiver_secret,
        sources,
    })
}

/// Where a home's services listen and what they reach: one host on loopback, or one of
/// the hosts of `--hosts` (an address of its namespace, the receiver on the bridge, the
/// PostgreSQL spool).
pub struct Place {
    /// The directory `secrets` made (`<dir>/secrets`); every host reads the same files.
    pub secrets_home: std::path::PathBuf,
    /// The intake's `listen` (ip:port).
    pub listen: String,
    /// The receiver (ip:port).
    pub receiver: String,
    /// The block the destinations may reach (`allow_private`).
    pub receiver_net: String,
    /// The `[spool]` section (empty: SQLite in the home).
    pub spool: String,
}

impl Place {
    /// One host: everything on 127.0.0.1, the SQLite spool in `home`.
    pub fn local(home: &Path, intake_port: u16, receiver_port: u16) -> Place {
        Place {
            secrets_home: home.to_path_buf(),
            listen: format!("127.0.0.1:{intake_port}"),
            receiver: format!("127.0.0.1:{receiver_port}"),
            receiver_net: "127.0.0.1/32".into(),
            spool: String::new(),
        }
    }
}

/// Write config.toml, migrate the spool, and require `hookspool check` to pass.
pub fn config(bin: &Path, home: &Path, place: &Place) -> Result<(), BoxError> {
    let secrets = place.secrets_home.join("secrets");
    let s = secrets.display();
    let listen = &place.listen;
    // An intake on an address other than loopback must say so (`allow_remote`).
    let remote = if listen.starts_with("127.") {
        ""
    } else {
        "allow_remote = true\n"
    };
    let mut toml = format!(
        r#"# Written by the soak (tests/soak/setup.rs).
[intake]
listen = "{listen}"
{remote}
[limits]
min_free_bytes = {MIN_FREE_BYTES}

[dispatch]
lease_grace_s = 5
backoff_base_s = 1
backoff_cap_s = 5

[dispatch.breaker]
trip_after = 3
cooldown_initial_s = 2
cooldown_max_s = 8

[sources.alpha]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.k"
dedup = "payload.id"
max_body_bytes = 4096
action = "recv-alpha"
secrets.secret = {{ file = "{s}/alpha" }}

[sources.beta]
type = "standard-webhooks"
key = "payload.k"
max_body_bytes = 4096
action = "recv-beta"
secrets.secret = {{ file = "{s}/beta" }}

[sources.gamma]
type = "template"
scheme = "timestamped"
header = "X-Gamma-Signature"
key = "payload.k"
dedup = "payload.id"
max_body_bytes = 2048
action = "recv-gamma"
secrets.secret = {{ file = "{s}/gamma" }}
"#
    );
    for r in ROUTES {
        let window = format!(
            "quiet_s = {:?}\nmax_s = {:?}\nmax_events = {}\nmax_bytes = {}\n",
            r.quiet_s, r.max_s, r.max_events, r.max_bytes
        );
        if r.tee {
            toml += &format!(
                "\n[[routes]]\nname = \"{}\"\nsource = \"{}\"\ntee = true\ndestination = \"{}\"\n{window}",
                r.route, r.source, r.destination
            );
        } else {
            // The source's implicit route (named after the source) takes the source's window.
            toml = toml.replace(
                &format!("action = \"{}\"\n", r.destination),
                &format!("action = \"{}\"\n{window}", r.destination),
            );
        }
    }
    for r in ROUTES {
        toml += &format!(
            r#"
[destinations.{d}]
type = "http"
url = "http://{receiver}/{d}"
allow_insecure = true
allow_private = ["{receiver_net}"]
timeout_s = {DESTINATION_TIMEOUT_S:?}
secret = {{ file = "{s}/receiver" }}
"#,
            d = r.destination,
            receiver = place.receiver,
            receiver_net = place.receiver_net,
        );
    }
    toml += &place.spool;
    std::fs::write(home.join("config.toml"), toml)?;
    hookspool(bin, home, &["migrate"])?;
    hookspool(bin, home, &["check"])?;
    Ok(())
}
