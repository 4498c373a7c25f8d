//! The disk's limit for one writer: fdatasync calls per second, each after one 4 KiB write,
//! on the filesystem the benchmark spools live on ($TMPDIR, through `tempfile`). Run first by
//! `bench/run.sh` so every ratio it prints compares figures from the same minute.
//!
//! `cargo run --release --example bench_fsync -- [seconds] [--smoke]`
//!
//! The writes overwrite a preallocated 1 MiB file in turn, as SQLite's WAL is overwritten
//! from its start once a checkpoint has reset it (the steady state of a busy spool), so the
//! figure is the faster of the two cases and the ratios against it the stricter ones. The
//! appending case (each fdatasync also flushes the new size) is printed for the record.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use common::{BoxError, figure, smoke_flag};

/// One write: a page, the unit SQLite writes its WAL frames in.
const WRITE_BYTES: usize = 4096;
/// The preallocated file the overwrites cycle through.
const FILE_BYTES: usize = 1 << 20;
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
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("fsync.bin");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    file.write_all_at(&vec![0u8; FILE_BYTES], 0)?;
    file.sync_all()?;
    let page = vec![0x5au8; WRITE_BYTES];
    let window = Duration::from_secs_f64(seconds);

    let slots = (FILE_BYTES / WRITE_BYTES) as u64;
    let (n, span) = timed(window, |i| {
        file.write_all_at(&page, (i % slots) * WRITE_BYTES as u64)?;
        file.sync_data()
    })?;
    let overwrite = n as f64 / span;

    let append = OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(dir.path().join("append.bin"))?;
    let (m, span_a) = timed(window, |_| {
        std::io::Write::write_all(&mut &append, &page)?;
        append.sync_data()
    })?;
    println!(
        "fdatasync after a {WRITE_BYTES} B write in {}: overwrite {overwrite:.0}/s ({n} in {span:.2} s), append {:.0}/s",
        dir.path().display(),
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
