//! The disk's limit for one writer: fdatasync calls per second, each after one 4 KiB write,
//! on the filesystem the benchmark spools live on ($TMPDIR, through `tempfile`). `bench/run.sh`
//! runs it first and last, for the record of how far the disk moved during the run; the
//! ratios themselves use probes taken right around each run (`common::DiskAround`).
//!
//! `cargo run --release --example bench_fsync -- [seconds] [--smoke]`
//!
//! The writes overwrite a preallocated 1 MiB file in turn, as SQLite's WAL is overwritten
//! from its start once a checkpoint has reset it (the steady state of a busy spool), so the
//! figure is the faster of the two cases and the ratios against it the stricter ones. The
//! appending case (each fdatasync also flushes the new size) is printed for the record.

mod common;

use std::fs::OpenOptions;
use std::time::{Duration, Instant};

use common::{BoxError, PROBE_WRITE_BYTES, fdatasync_per_s, figure, smoke_flag};

const SECONDS_DEFAULT: f64 = 3.0;
const SECONDS_SMOKE: f64 = 0.5;

fn main() -> Result<(), BoxError> {
    let (smoke, args) = smoke_flag();
    let default = if smoke {
        SECONDS_SMOKE
    } else {
        SECONDS_DEFAULT
    };
    let seconds: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(default);
    let window = Duration::from_secs_f64(seconds);
    let overwrite = fdatasync_per_s(seconds)?;
    let dir = tempfile::tempdir()?;
    let page = vec![0x5au8; PROBE_WRITE_BYTES];
    let append = OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(dir.path().join("append.bin"))?;
    let (m, span_a) = timed(window, |_| {
        std::io::Write::write_all(&mut &append, &page)?;
        append.sync_data()
    })?;
    println!(
        "fdatasync after a {PROBE_WRITE_BYTES} B write under {}: overwrite {overwrite:.0}/s, append {:.0}/s ({m} in {span_a:.2} s)",
        dir.path().parent().map_or(dir.path(), |p| p).display(),
        m as f64 / span_a
    );
    figure("fdatasync_per_s", overwrite);
    Ok(())
}

/// Run `step(i)` until `window` has passed; returns how many ran and the seconds they took.
fn timed(
    window: Duration,
    mut step: impl FnMut(u64) -> std::io::Result<()>,
) -> std::io::Result<(u64, f64)> {
    let t = Instant::now();
    let mut i = 0u64;
    while t.elapsed() < window {
        step(i)?;
        i += 1;
    }
    Ok((i, t.elapsed().as_secs_f64()))
}
