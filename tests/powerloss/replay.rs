//! The power-loss replayer: reads the op log that `shim.c` (and the load client's ACK
//! records) wrote during a real run, and builds the files a disk could hold after a power
//! cut at a given point of that run.
//!
//! The model of the disk, stricter than any real filesystem promises to be:
//! * A write or truncate of a file is durable once an fsync/fdatasync of that file (any fd
//!   of it) has returned after it. Before that it is pending: after a cut, any subset of a
//!   file's pending writes may have reached the disk, each of them whole or torn at a
//!   512-byte sector boundary (any subset of its sectors), applied in the order they were
//!   issued (a page cache never writes an older version over a newer one).
//! * Creating, unlinking or renaming a file is durable once an fsync of its directory has
//!   returned after it; pending namespace changes survive as a prefix of their order (a
//!   journaling filesystem commits metadata in order). A file whose creation did not
//!   survive is gone with its data.
//!
//! The `-shm` file is never recorded: it is shared memory that SQLite rebuilds from the WAL.
//! Must not: run processes or open the database (the test does that with what it builds).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The record header of `shim.c` (`struct rec`), little-endian on every host we build for.
pub const REC_MAGIC: u32 = 0x504c_5752;
pub const REC_HEADER_BYTES: usize = 32;
pub const OP_OPEN: u32 = 1;
pub const OP_WRITE: u32 = 2;
pub const OP_TRUNC: u32 = 3;
pub const OP_SYNC: u32 = 4;
pub const OP_CLOSE: u32 = 5;
pub const OP_UNLINK: u32 = 6;
pub const OP_RENAME: u32 = 7;
pub const OP_ACK: u32 = 8;
/// `aux` bits of an OPEN record.
const OPEN_CREATED: u32 = 1;
const OPEN_TRUNCATED: u32 = 2;
const OPEN_DIR: u32 = 4;
/// The unit a torn write is cut at.
pub const SECTOR_BYTES: usize = 512;

/// One ACK record as the load client writes it (same header as the shim's records).
pub fn ack_record(id: &str) -> Vec<u8> {
    let mut r = Vec::with_capacity(REC_HEADER_BYTES + id.len());
    r.extend_from_slice(&REC_MAGIC.to_le_bytes());
    r.extend_from_slice(&OP_ACK.to_le_bytes());
    r.extend_from_slice(&(-1i32).to_le_bytes());
    r.extend_from_slice(&0u32.to_le_bytes());
    r.extend_from_slice(&0u64.to_le_bytes());
    r.extend_from_slice(&(id.len() as u64).to_le_bytes());
    r.extend_from_slice(id.as_bytes());
    r
}

/// An operation as the replayer sees it: files are inodes, not fds or paths.
#[derive(Debug, Clone)]
pub enum Ev {
    /// A new file at `name` (a basename in the spool directory).
    Create {
        name: String,
        ino: usize,
    },
    Unlink {
        name: String,
    },
    Rename {
        from: String,
        to: String,
    },
    Write {
        ino: usize,
        off: u64,
        data: Vec<u8>,
    },
    Truncate {
        ino: usize,
        len: u64,
    },
    FileSync {
        ino: usize,
        /// fdatasync (the intake's own sync of the WAL) rather than fsync (SQLite's).
        data_only: bool,
    },
    DirSync,
    Ack {
        id: String,
    },
}

impl Ev {
    fn is_namespace(&self) -> bool {
        matches!(
            self,
            Ev::Create { .. } | Ev::Unlink { .. } | Ev::Rename { .. }
        )
    }
}

/// A run's log, resolved to inodes.
#[derive(Debug, Default)]
pub struct Run {
    pub evs: Vec<Ev>,
    /// The last name each inode had, for messages.
    pub names: Vec<String>,
}

fn basename(p: &str) -> String {
    Path::new(p)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Parses the log. Every record must be whole and known: a log the shim did not write
/// completely is an error, never a shorter run.
pub fn parse(log: &[u8]) -> Result<Run, String> {
    let mut run = Run::default();
    let mut fds: HashMap<i32, Option<usize>> = HashMap::new(); // None: the directory
    let mut live: HashMap<String, usize> = HashMap::new();
    let mut at = 0;
    while at < log.len() {
        if log.len() - at < REC_HEADER_BYTES {
            return Err(format!("truncated record header at byte {at}"));
        }
        let h = &log[at..at + REC_HEADER_BYTES];
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
        if u32_at(0) != REC_MAGIC {
            return Err(format!("bad record magic at byte {at}"));
        }
        let (op, fd, aux, off, len) = (
            u32_at(4),
            u32_at(8) as i32,
            u32_at(12),
            u64_at(16),
            u64_at(24) as usize,
        );
        let body_at = at + REC_HEADER_BYTES;
        if log.len() - body_at < len {
            return Err(format!("truncated record body at byte {at}"));
        }
        let body = &log[body_at..body_at + len];
        at = body_at + len;
        let text = || String::from_utf8_lossy(body).into_owned();
        let ino_of = |fds: &HashMap<i32, Option<usize>>| -> Result<Option<usize>, String> {
            fds.get(&fd)
                .copied()
                .ok_or_else(|| format!("op {op} on fd {fd} that was never opened"))
        };
        match op {
            OP_OPEN => {
                if aux & OPEN_DIR != 0 {
                    fds.insert(fd, None);
                    continue;
                }
                let name = basename(&text());
                let ino = match live.get(&name) {
                    Some(&ino) if aux & OPEN_CREATED == 0 => ino,
                    Some(_) => return Err(format!("{name} created while it existed")),
                    None if aux & OPEN_CREATED != 0 => {
                        let ino = run.names.len();
                        run.names.push(name.clone());
                        live.insert(name.clone(), ino);
                        run.evs.push(Ev::Create { name, ino });
                        ino
                    }
                    // The run starts from an empty directory: every file is created in it.
                    None => return Err(format!("{name} opened but never created")),
                };
                if aux & OPEN_TRUNCATED != 0 {
                    run.evs.push(Ev::Truncate { ino, len: 0 });
                }
                fds.insert(fd, Some(ino));
            }
            OP_WRITE => match ino_of(&fds)? {
                Some(ino) => run.evs.push(Ev::Write {
                    ino,
                    off,
                    data: body.to_vec(),
                }),
                None => return Err("a write to the directory".into()),
            },
            OP_TRUNC => match ino_of(&fds)? {
                Some(ino) => run.evs.push(Ev::Truncate { ino, len: off }),
                None => return Err("a truncate of the directory".into()),
            },
            OP_SYNC => match ino_of(&fds)? {
                Some(ino) => run.evs.push(Ev::FileSync {
                    ino,
                    data_only: aux == 1,
                }),
                None => run.evs.push(Ev::DirSync),
            },
            OP_CLOSE => {
                fds.remove(&fd);
            }
            OP_UNLINK => {
                let name = basename(&text());
                if live.remove(&name).is_none() {
                    return Err(format!("{name} unlinked but never created"));
                }
                run.evs.push(Ev::Unlink { name });
            }
            OP_RENAME => {
                let mut parts = body.splitn(2, |b| *b == 0);
                let from = basename(&String::from_utf8_lossy(parts.next().unwrap_or_default()));
                let to = basename(&String::from_utf8_lossy(parts.next().unwrap_or_default()));
                let ino = live
                    .remove(&from)
                    .ok_or_else(|| format!("{from} renamed but never created"))?;
                live.insert(to.clone(), ino);
                run.names[ino] = to.clone();
                run.evs.push(Ev::Rename { from, to });
            }
            OP_ACK => run.evs.push(Ev::Ack { id: text() }),
            other => return Err(format!("unknown op {other}")),
        }
    }
    Ok(run)
}

/// What survives of the pending operations at a cut.
#[derive(Debug, Clone)]
pub enum Pending {
    /// Nothing after the last syncs.
    None,
    /// Everything that was issued (what a crash without power loss leaves).
    All,
    /// A seeded choice: each pending write survives with probability 1/2, a surviving one is
    /// torn with probability 3/10, and a random prefix of the pending namespace changes.
    Random(u64),
}

/// A planted fault for the harness's self-test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Leave out the last durable write to the WAL before the cut: a replay that drops one
    /// synced write must be reported as loss or corruption.
    DropLastSyncedWalWrite,
}

/// The files a disk could hold after a cut, and how they were chosen.
#[derive(Debug, Default)]
pub struct State {
    /// basename -> content.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Pending writes that survived whole, torn, or not at all.
    pub kept: usize,
    pub torn: usize,
    pub lost: usize,
    /// Whether the fault could be planted (a durable WAL write existed).
    pub fault_planted: bool,
}

/// A small seeded generator (xorshift64*), so every state can be rebuilt from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

fn apply_write(file: &mut Vec<u8>, off: u64, data: &[u8], sectors: Option<&[bool]>) {
    let off = off as usize;
    let end = off + data.len();
    match sectors {
        None => {
            if file.len() < end {
                file.resize(end, 0);
            }
            file[off..end].copy_from_slice(data);
        }
        Some(keep) => {
            // Sector boundaries are the file's, not the write's.
            let mut at = off;
            let mut i = 0;
            while at < end {
                let next = ((at / SECTOR_BYTES) + 1) * SECTOR_BYTES;
                let stop = next.min(end);
                if keep[i] {
                    if file.len() < stop {
                        file.resize(stop, 0);
                    }
                    file[at..stop].copy_from_slice(&data[at - off..stop - off]);
                }
                at = stop;
                i += 1;
            }
        }
    }
}

/// Number of sector pieces a write at `off` of `len` bytes spans.
fn pieces(off: u64, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let first = off as usize / SECTOR_BYTES;
    let last = (off as usize + len - 1) / SECTOR_BYTES;
    last - first + 1
}

impl Run {
    /// Counts by kind and file, for the report: "spool.db: 120 writes, 3 syncs; ...".
    pub fn summary(&self) -> String {
        let mut per: BTreeMap<String, (usize, usize, usize, usize)> = BTreeMap::new();
        let mut dir_syncs = 0;
        for e in &self.evs {
            match e {
                Ev::Write { ino, .. } => per.entry(self.names[*ino].clone()).or_default().0 += 1,
                Ev::Truncate { ino, .. } => per.entry(self.names[*ino].clone()).or_default().1 += 1,
                Ev::FileSync { ino, data_only } => {
                    let e = per.entry(self.names[*ino].clone()).or_default();
                    e.2 += 1;
                    e.3 += usize::from(*data_only);
                }
                Ev::DirSync => dir_syncs += 1,
                _ => {}
            }
        }
        let mut out: Vec<String> = per
            .iter()
            .map(|(n, (w, t, s, d))| {
                format!("{n}: {w} writes, {t} truncates, {s} syncs ({d} of them fdatasync)")
            })
            .collect();
        out.push(format!("directory: {dir_syncs} syncs"));
        out.join("; ")
    }

    /// Positions of the acknowledgements, in log order.
    pub fn acks(&self) -> Vec<(usize, &str)> {
        self.evs
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Ev::Ack { id } => Some((i, id.as_str())),
                _ => None,
            })
            .collect()
    }

    /// Ids acknowledged before the cut (`evs[..cut]` happened).
    pub fn acked_before(&self, cut: usize) -> Vec<&str> {
        self.evs[..cut]
            .iter()
            .filter_map(|e| match e {
                Ev::Ack { id } => Some(id.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The fdatasyncs of the file named `name` (the intake's own syncs of the WAL).
    pub fn data_syncs_of(&self, name: &str) -> usize {
        self.evs
            .iter()
            .filter(
                |e| matches!(e, Ev::FileSync { ino, data_only: true } if self.names[*ino] == name),
            )
            .count()
    }

    /// Interesting cuts: just before and just after every sync, just before and just after
    /// every ack, and just after every write that ends a run of writes (a COMMIT's last
    /// frame, with the sync that covers it still to come), in log order, plus the end of
    /// the run.
    pub fn candidate_cuts(&self) -> Vec<usize> {
        let mut cuts = Vec::new();
        for (i, e) in self.evs.iter().enumerate() {
            match e {
                Ev::FileSync { .. } | Ev::DirSync => {
                    cuts.push(i);
                    cuts.push(i + 1);
                }
                Ev::Ack { .. } => {
                    cuts.push(i);
                    cuts.push(i + 1);
                }
                Ev::Write { .. }
                    if !matches!(self.evs.get(i + 1), Some(Ev::Write { .. }) | None) =>
                {
                    cuts.push(i + 1)
                }
                _ => {}
            }
        }
        cuts.push(self.evs.len());
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }

    /// The inode named `*-wal` at the cut, if any.
    fn wal_inode(&self, cut: usize) -> Option<usize> {
        self.evs[..cut].iter().rev().find_map(|e| match e {
            Ev::Create { name, ino } if name.ends_with("-wal") => Some(*ino),
            _ => None,
        })
    }

    /// The files after a power cut at `cut`.
    pub fn state_at(&self, cut: usize, pending: &Pending, fault: Fault) -> State {
        let evs = &self.evs[..cut];
        let mut rng = match pending {
            Pending::Random(seed) => Some(Rng::new(*seed)),
            _ => None,
        };
        let mut last_sync: HashMap<usize, usize> = HashMap::new();
        let mut last_dir_sync = None;
        for (i, e) in evs.iter().enumerate() {
            match e {
                Ev::FileSync { ino, .. } => {
                    last_sync.insert(*ino, i);
                }
                Ev::DirSync => last_dir_sync = Some(i),
                _ => {}
            }
        }
        let mut st = State::default();

        // The fault: the last WAL write that a sync before the cut made durable.
        let wal = self.wal_inode(cut);
        let dropped = match (fault, wal) {
            (Fault::DropLastSyncedWalWrite, Some(w)) => last_sync.get(&w).and_then(|&s| {
                evs[..s]
                    .iter()
                    .rposition(|e| matches!(e, Ev::Write { ino, .. } if *ino == w))
            }),
            _ => None,
        };
        st.fault_planted = dropped.is_some();

        // Namespace: durable changes, then a prefix of the pending ones.
        let ns: Vec<usize> = (0..evs.len()).filter(|&i| evs[i].is_namespace()).collect();
        let durable_ns = ns
            .iter()
            .filter(|&&i| last_dir_sync.is_some_and(|d| i < d))
            .count();
        let pending_ns = ns.len() - durable_ns;
        let keep_ns = durable_ns
            + match (pending, rng.as_mut()) {
                (Pending::None, _) => 0,
                (Pending::All, _) => pending_ns,
                (Pending::Random(_), Some(r)) => r.below(pending_ns as u64 + 1) as usize,
                (Pending::Random(_), None) => unreachable!("a random state has a generator"),
            };
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for &i in &ns[..keep_ns] {
            match &evs[i] {
                Ev::Create { name, ino } => {
                    names.insert(name.clone(), *ino);
                }
                Ev::Unlink { name } => {
                    names.remove(name);
                }
                Ev::Rename { from, to } => {
                    if let Some(ino) = names.remove(from) {
                        names.insert(to.clone(), ino);
                    }
                }
                _ => unreachable!("only namespace events are listed"),
            }
        }

        // Data: durable operations whole, pending ones as chosen.
        let mut content: HashMap<usize, Vec<u8>> = HashMap::new();
        for (i, e) in evs.iter().enumerate() {
            let (ino, durable) = match e {
                Ev::Write { ino, .. } | Ev::Truncate { ino, .. } => {
                    (*ino, last_sync.get(ino).is_some_and(|&s| i < s))
                }
                _ => continue,
            };
            if Some(i) == dropped {
                continue;
            }
            let file = content.entry(ino).or_default();
            let mut torn_sectors = None;
            if !durable {
                let keep = match (pending, rng.as_mut()) {
                    (Pending::None, _) => false,
                    (Pending::All, _) => true,
                    (Pending::Random(_), Some(r)) => r.chance(1, 2),
                    (Pending::Random(_), None) => unreachable!(),
                };
                if !keep {
                    st.lost += 1;
                    continue;
                }
                if let (Ev::Write { off, data, .. }, Some(r)) = (e, rng.as_mut()) {
                    let n = pieces(*off, data.len());
                    if n > 0 && r.chance(3, 10) {
                        let mut sectors: Vec<bool> = (0..n).map(|_| r.chance(1, 2)).collect();
                        // A torn write is never the whole write.
                        let k = r.below(n as u64) as usize;
                        sectors[k] = false;
                        torn_sectors = Some(sectors);
                        st.torn += 1;
                    } else {
                        st.kept += 1;
                    }
                } else {
                    st.kept += 1;
                }
            }
            match e {
                Ev::Write { off, data, .. } => {
                    apply_write(file, *off, data, torn_sectors.as_deref())
                }
                Ev::Truncate { len, .. } => file.resize(*len as usize, 0),
                _ => unreachable!(),
            }
        }
        for (name, ino) in names {
            st.files
                .insert(name, content.remove(&ino).unwrap_or_default());
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(op: u32, fd: i32, aux: u32, off: u64, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&REC_MAGIC.to_le_bytes());
        r.extend_from_slice(&op.to_le_bytes());
        r.extend_from_slice(&fd.to_le_bytes());
        r.extend_from_slice(&aux.to_le_bytes());
        r.extend_from_slice(&off.to_le_bytes());
        r.extend_from_slice(&(body.len() as u64).to_le_bytes());
        r.extend_from_slice(body);
        r
    }

    fn sample() -> Run {
        let mut log = Vec::new();
        log.extend(rec(OP_OPEN, 5, OPEN_DIR, 0, b"/h"));
        log.extend(rec(OP_OPEN, 3, OPEN_CREATED, 0, b"/h/spool.db-wal"));
        log.extend(rec(OP_WRITE, 3, 0, 0, &[1u8; 1024]));
        log.extend(rec(OP_SYNC, 3, 0, 0, b""));
        log.extend(rec(OP_SYNC, 5, 0, 0, b""));
        log.extend(ack_record("a"));
        log.extend(rec(OP_WRITE, 3, 0, 1024, &[2u8; 1024]));
        parse(&log).expect("parses")
    }

    #[test]
    fn synced_writes_survive_and_unsynced_ones_may_not() {
        let run = sample();
        let end = run.evs.len();
        let none = run.state_at(end, &Pending::None, Fault::None);
        assert_eq!(none.files["spool.db-wal"], vec![1u8; 1024]);
        let all = run.state_at(end, &Pending::All, Fault::None);
        assert_eq!(all.files["spool.db-wal"].len(), 2048);
        // Before the directory sync, the file itself may not exist.
        let early = run.state_at(3, &Pending::None, Fault::None);
        assert!(early.files.is_empty());
        assert_eq!(run.acked_before(end), vec!["a"]);
        let dropped = run.state_at(end, &Pending::None, Fault::DropLastSyncedWalWrite);
        assert!(dropped.fault_planted);
        assert!(dropped.files["spool.db-wal"].is_empty());
    }

    #[test]
    fn torn_writes_cut_at_sector_boundaries_and_are_never_whole() {
        let run = sample();
        let end = run.evs.len();
        let mut torn = 0;
        for seed in 0..200 {
            let st = run.state_at(end, &Pending::Random(seed), Fault::None);
            let f = &st.files["spool.db-wal"];
            if st.torn > 0 {
                torn += 1;
                assert_eq!(f.len() % SECTOR_BYTES, 0);
                assert!(f[1024..].contains(&0) || f.len() < 2048);
            }
            assert_eq!(&f[..1024], &[1u8; 1024][..]);
        }
        assert!(torn > 10, "only {torn} torn states in 200");
    }

    #[test]
    fn a_log_cut_short_is_an_error() {
        let mut log = rec(OP_OPEN, 3, OPEN_CREATED, 0, b"/h/spool.db");
        log.extend(rec(OP_WRITE, 3, 0, 0, &[0u8; 100]));
        log.truncate(log.len() - 1);
        assert!(parse(&log).is_err());
    }
}
