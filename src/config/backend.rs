//! `[spool] backend` and `url` (issue 32): which database holds the spool. `sqlite` (the
//! default) is the file at `spool.db`; `postgres` is a PostgreSQL database whose libpq URL
//! is a secret reference, since it may carry a password. Validation only: the URL is read
//! at use time by whoever connects (`store::pg`), and no problem here ever quotes a value of
//! `url`, which is why `raw` keeps it as plain TOML.

use crate::secret::SecretRef;

use super::{Problem, problem};

/// Where the spool lives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Backend {
    /// The SQLite file at `Config::db`.
    #[default]
    Sqlite,
    /// A PostgreSQL database; the reference resolves to its libpq URL.
    Postgres { url: SecretRef },
}

impl Backend {
    /// The word `backend =` takes.
    pub fn as_str(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres { .. } => "postgres",
        }
    }
}

impl super::Config {
    /// Where the configured spool is, the PostgreSQL URL read from its reference now (a
    /// service reads it at start and at each reconnect). An error names the reference,
    /// never what it holds.
    pub fn spool_at(&self) -> Result<crate::store::SpoolAt, crate::store::StoreError> {
        use crate::store::{SpoolAt, StoreError};
        match &self.backend {
            Backend::Sqlite => Ok(SpoolAt::File(self.db.clone())),
            Backend::Postgres { url } => {
                let bytes = url
                    .resolve()
                    .map_err(|e| StoreError::Invalid(format!("spool.url: {e}")))?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    StoreError::Invalid(format!(
                        "spool.url: {} is not UTF-8 text; write the libpq URL in it (postgresql://...)",
                        url.describe()
                    ))
                })?;
                Ok(SpoolAt::Postgres(text.trim().to_string()))
            }
        }
    }

    /// Open the configured spool (`Store::open_at`).
    pub fn open_spool(
        &self,
        role: crate::store::Role,
        busy_timeout: std::time::Duration,
    ) -> Result<crate::store::Store, crate::store::StoreError> {
        crate::store::Store::open_at(&self.spool_at()?, role, busy_timeout)
    }
}

const URL_EXAMPLE: &str = r#"url = { file = "/etc/hookspool/secrets/pg-url" }"#;

/// `[spool] backend` and `url` validated into a [`Backend`].
pub fn backend(
    errors: &mut Vec<Problem>,
    backend: Option<&str>,
    url: Option<&toml::Value>,
) -> Backend {
    let given = url.is_some();
    let url = url.and_then(|v| url_ref(errors, v));
    match backend.unwrap_or("sqlite") {
        "sqlite" => {
            if url.is_some() {
                errors.push(problem(
                    "spool.url",
                    "is read only with backend = \"postgres\"; write backend = \"postgres\" to use PostgreSQL, or remove url to keep the SQLite spool",
                ));
            }
            Backend::Sqlite
        }
        "postgres" => match url {
            Some(url) => Backend::Postgres { url },
            // A url that was given but refused has its own problem already.
            None if given => Backend::Sqlite,
            None => {
                errors.push(problem(
                    "spool.url",
                    format!("backend = \"postgres\" needs the connection: write {URL_EXAMPLE}, a file (mode 0600) holding a libpq URL such as postgresql://hookspool:PASSWORD@db.internal/hookspool?sslmode=verify-full"),
                ));
                Backend::Sqlite
            }
        },
        other => {
            errors.push(problem(
                "spool.backend",
                format!("{other:?} is not a spool backend; write backend = \"sqlite\" (the default) or backend = \"postgres\""),
            ));
            Backend::Sqlite
        }
    }
}

/// The reference `url` holds. A string is refused without being read: it would be a URL,
/// and so maybe a password, written in the config.
fn url_ref(errors: &mut Vec<Problem>, v: &toml::Value) -> Option<SecretRef> {
    if v.is_str() {
        errors.push(problem(
            "spool.url",
            format!("a URL may carry a password, so it is never written in the config: put it in a file only the service can read and write {URL_EXAMPLE} (or {{ env = \"NAME\" }})"),
        ));
        return None;
    }
    match v.clone().try_into::<SecretRef>() {
        Ok(r) => Some(r),
        Err(_) => {
            errors.push(problem(
                "spool.url",
                format!("is a secret reference: write {URL_EXAMPLE}, {{ env = \"NAME\" }} or {{ env_file = \"/path\", key = \"NAME\" }}"),
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(backend_word: Option<&str>, url: Option<&str>) -> (Backend, Vec<Problem>) {
        let url: Option<toml::Value> = url.map(|u| {
            let t: toml::Table = toml::from_str(&format!("url = {u}")).unwrap();
            t["url"].clone()
        });
        let mut errors = Vec::new();
        let b = backend(&mut errors, backend_word, url.as_ref());
        (b, errors)
    }

    #[test]
    fn sqlite_is_the_default_and_postgres_takes_a_reference() {
        assert_eq!(run(None, None), (Backend::Sqlite, vec![]));
        assert_eq!(run(Some("sqlite"), None), (Backend::Sqlite, vec![]));
        let (b, e) = run(Some("postgres"), Some(r#"{ file = "/etc/pg-url" }"#));
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(
            b,
            Backend::Postgres {
                url: SecretRef::File {
                    file: "/etc/pg-url".into()
                }
            }
        );
    }

    #[test]
    fn every_mistake_names_the_key_and_what_to_write_and_never_the_url() {
        let sentinel = "postgresql://u:SENTINEL-PW-7731@h/db";
        for (backend_word, url, key, says) in [
            (Some("postgres"), None, "spool.url", "url = { file ="),
            (
                Some("postgres"),
                Some(format!("{sentinel:?}")),
                "spool.url",
                "never written in the config",
            ),
            (
                Some("sqlite"),
                Some(r#"{ file = "/x" }"#.to_string()),
                "spool.url",
                "backend = \"postgres\"",
            ),
            (Some("mysql"), None, "spool.backend", "backend = \"sqlite\""),
            (
                Some("postgres"),
                Some(r#"{ path = "/x" }"#.into()),
                "spool.url",
                "is a secret reference",
            ),
        ] {
            let (_, e) = run(backend_word, url.as_deref());
            assert_eq!(e.len(), 1, "{backend_word:?} {url:?}: {e:?}");
            assert_eq!(e[0].key, key);
            assert!(e[0].message.contains(says), "{}", e[0].message);
            assert!(!e[0].message.contains("SENTINEL"), "{}", e[0].message);
        }
    }
}
