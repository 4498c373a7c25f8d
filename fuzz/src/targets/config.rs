//! Config files (`config::parse`, which `check`, every start and every reload
//! run), then what `check` and the intake do with a config that parses: build every source
//! (`sources::build`, the template source's selectors included) and resolve its routes.
//!
//! Input: the config text (lossy UTF-8). The first byte's low bit picks strict (`check`) or
//! lenient (runtime) parsing; the byte is still part of the text.
//!
//! Beyond "does not panic": a refusal names at least one problem, each with a message;
//! parsing is deterministic; a config strict parsing accepts, lenient parsing accepts as the
//! same config; a validated config holds no NaN or infinite number (SQLite stores NaN as
//! NULL, and every window, timeout and bound is arithmetic later).

use std::collections::BTreeMap;

use crate::debug_has_non_finite;
use hookspool::config::{self, PathInputs};
use hookspool::sources;

pub fn check(data: &[u8]) {
    let strict = data.first().is_some_and(|b| b & 1 == 1);
    let text = String::from_utf8_lossy(data);
    let parsed = config::parse(&text, None, &PathInputs::default(), strict);
    let (cfg, _warnings) = match parsed {
        Ok(ok) => ok,
        Err(problems) => {
            assert!(!problems.is_empty(), "refused with no problem");
            for p in &problems {
                assert!(!p.message.is_empty(), "a problem without a message: {p:?}");
            }
            return;
        }
    };
    let again = config::parse(&text, None, &PathInputs::default(), strict);
    assert_eq!(
        again.as_ref().ok().map(|(c, _)| c),
        Some(&cfg),
        "not deterministic"
    );
    if strict {
        let lenient = config::parse(&text, None, &PathInputs::default(), false);
        assert_eq!(
            lenient.as_ref().ok().map(|(c, _)| c),
            Some(&cfg),
            "strict accepts what lenient refuses or reads differently"
        );
    }
    let shown = format!("{cfg:?}");
    assert!(
        !debug_has_non_finite(&shown),
        "a non-finite number: {shown}"
    );

    let attrs = BTreeMap::new();
    for (name, sc) in &cfg.sources {
        if let Ok(src) = sources::build(name, &sc.kind, &sc.options) {
            let _ = src.declared();
            for (event_action, destination) in
                [(None, None), (Some("fuzz"), None), (None, Some("fuzz"))]
            {
                let _ = cfg.route(&config::RouteQuery {
                    source: sc,
                    attrs: &attrs,
                    event_action,
                    destination,
                });
            }
        }
    }
    let _ = cfg.retention();
}
