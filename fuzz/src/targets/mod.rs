//! The fuzz targets, one module each, as plain `check(data)` functions: honggfuzz drives
//! them from the binaries in src/bin/, and the corpus test below replays every committed
//! input through them without the fuzzer.

pub mod capture;
pub mod config;
pub mod recipe;
pub mod select;
pub mod source_flow;

/// The names of the targets, as `run.sh` and the corpus directories call them.
pub const TARGETS: &[&str] = &["capture", "source_flow", "select", "config", "recipe"];

/// A target's check function by name.
pub fn by_name(name: &str) -> Option<fn(&[u8])> {
    match name {
        "capture" => Some(capture::check),
        "source_flow" => Some(source_flow::check),
        "select" => Some(select::check),
        "config" => Some(config::check),
        "recipe" => Some(recipe::check),
        _ => None,
    }
}

/// A target binary's main: with file arguments, runs each file once (to reproduce a crash
/// without the fuzzer: `hfuzz_target/<triple>/release/<target> <file>...`); without, is
/// honggfuzz's persistent loop.
pub fn main(check: fn(&[u8])) {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if !files.is_empty() {
        for f in files {
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{f}: {e}"));
            eprintln!("{f}: {} bytes", data.len());
            check(&data);
        }
        return;
    }
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { check(data) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed input, seeds and crash regressions alike, passes its target's checks.
    #[test]
    fn every_committed_input_passes_its_target() {
        for t in TARGETS {
            let check = by_name(t).expect("a target");
            let dir = crate::seeds::corpus_dir(t);
            let mut n = 0;
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                if let Err(e) = std::panic::catch_unwind(|| check(&data)) {
                    let why = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    panic!("{}: {why}", path.display());
                }
                n += 1;
            }
            assert!(n > 0, "{t}: an empty corpus");
        }
    }
}
