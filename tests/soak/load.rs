//! The load client: one task per (source, key) sends signed webhooks in bursts, each event
//! with its own dedup id and a per-key sequence number, waiting for each answer before the
//! next event of its key (so the commit order of a key's acked events is its send order). A
//! failed send (refused, timed out, any non-2xx) is retried with the same id and body until
//! `give_up` has passed, as a provider that retries would. Every 2xx is recorded with its
//! key and order, in memory for the checker and in `acks.jsonl`.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use sha2::Sha256;

use super::verdict::Acked;

/// How a source is signed (the intake side of the three schemes the soak configures).
#[derive(Clone, Debug)]
pub enum Scheme {
    /// `hmac-sha256-hex` with prefix `sha256=` in `header`.
    HexSha256 { header: &'static str },
    /// Standard Webhooks v1 (`webhook-id`, `webhook-timestamp`, `webhook-signature`).
    StandardWebhooks,
    /// `timestamped`: `t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>` in `header`.
    Timestamped { header: &'static str },
}

#[derive(Clone, Debug)]
pub struct SourceLoad {
    pub name: String,
    pub scheme: Scheme,
    /// The HMAC key bytes (a whsec_ secret already decoded).
    pub key: Vec<u8>,
    pub keys: Vec<String>,
    /// Padding bytes per event, min and max.
    pub pad: (usize, usize),
}

#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// The intakes' base URLs: each request goes to the next one (round-robin over every
    /// send and retry), so a retry after a dead intake's refusal reaches another.
    pub urls: Vec<String>,
    pub rate_per_s: f64,
    pub burst_max: usize,
    pub pause_max: Duration,
    pub give_up: Duration,
    pub request_timeout: Duration,
}

/// Answers counted by kind, split by whether a disk episode was on when they arrived.
#[derive(Default)]
pub struct Tally {
    pub sent: AtomicU64,
    pub ok_200: AtomicU64,
    pub ok_other_2xx: AtomicU64,
    pub duplicate_answers: AtomicU64,
    pub s503_retry_after: [AtomicU64; 2],
    pub s503_bare: [AtomicU64; 2],
    pub refused: [AtomicU64; 2],
    pub timeouts: [AtomicU64; 2],
    pub other_errors: [AtomicU64; 2],
    pub abandoned: AtomicU64,
    pub other_status: Mutex<BTreeMap<u16, u64>>,
}

pub struct Load {
    pub tally: Arc<Tally>,
    pub acked: Arc<Mutex<Vec<Acked>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct Ctx {
    cfg: LoadConfig,
    client: reqwest::Client,
    tally: Arc<Tally>,
    acked: Arc<Mutex<Vec<Acked>>>,
    sizes: Arc<Mutex<HashMap<String, usize>>>,
    log: Mutex<std::io::BufWriter<std::fs::File>>,
    stop: Arc<AtomicBool>,
    disk: Arc<AtomicBool>,
    bucket: Mutex<Instant>,
    started: Instant,
    /// Requests sent so far, for the round-robin over `cfg.urls`.
    next_url: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Load {
    /// Start one task per (source, key) on the current runtime. `disk` is raised by the
    /// orchestrator while a disk episode is on.
    pub fn start(
        cfg: LoadConfig,
        sources: &[SourceLoad],
        sizes: Arc<Mutex<HashMap<String, usize>>>,
        seed: u64,
        started: Instant,
        log: std::fs::File,
        disk: Arc<AtomicBool>,
    ) -> Result<Load, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(cfg.request_timeout)
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(64)
            .build()?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Arc::new(Ctx {
            cfg,
            client,
            tally: Arc::new(Tally::default()),
            acked: Arc::new(Mutex::new(Vec::new())),
            sizes,
            log: Mutex::new(std::io::BufWriter::new(log)),
            stop: stop.clone(),
            disk,
            bucket: Mutex::new(Instant::now()),
            started,
            next_url: AtomicU64::new(0),
        });
        let mut tasks = Vec::new();
        let mut n = 0u64;
        for s in sources {
            for k in &s.keys {
                n += 1;
                // Each key has its own stream, so one key's schedule does not depend on how
                // the others interleave. Wrapping: the product a release build computes, so a
                // debug build replays a seed the same and does not panic on the overflow.
                let rng = Xoshiro256PlusPlus::seed_from_u64(
                    seed ^ 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(n),
                );
                tasks.push(tokio::spawn(key_task(
                    ctx.clone(),
                    s.clone(),
                    k.clone(),
                    rng,
                )));
            }
        }
        Ok(Load {
            tally: ctx.tally.clone(),
            acked: ctx.acked.clone(),
            stop,
            tasks,
        })
    }

    /// Stop sending: each task finishes the event in hand (its retries are bounded by
    /// give_up). Returns how many tasks did not finish within `bound`.
    pub async fn stop(self, bound: Duration) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let until = tokio::time::Instant::now() + bound;
        let mut late = 0;
        for t in self.tasks {
            if tokio::time::timeout_at(until, t).await.is_err() {
                late += 1;
            }
        }
        late
    }
}

async fn key_task(ctx: Arc<Ctx>, src: SourceLoad, key: String, mut rng: Xoshiro256PlusPlus) {
    let mut seq = 0u64;
    while !ctx.stop.load(Ordering::SeqCst) {
        let burst = rng.random_range(1..=ctx.cfg.burst_max);
        for _ in 0..burst {
            if ctx.stop.load(Ordering::SeqCst) {
                break;
            }
            seq += 1;
            let pad = rng.random_range(src.pad.0..=src.pad.1);
            let id = format!("{}-{key}-{seq}", src.name);
            // Compact JSON with no escapes: what the receiver re-reads has the same length.
            let body = format!(
                r#"{{"id":"{id}","k":"{key}","seq":{seq},"pad":"{}"}}"#,
                "x".repeat(pad)
            );
            lock(&ctx.sizes).insert(id.clone(), body.len());
            send_until_acked(&ctx, &src, &key, seq, &id, body).await;
        }
        let pause = ctx.cfg.pause_max.mul_f64(rng.random_range(0.0..1.0));
        tokio::time::sleep(pause).await;
    }
}

async fn send_until_acked(
    ctx: &Ctx,
    src: &SourceLoad,
    key: &str,
    seq: u64,
    id: &str,
    body: String,
) {
    let until = Instant::now() + ctx.cfg.give_up;
    let mut backoff = Duration::from_millis(100);
    loop {
        take_slot(ctx).await;
        ctx.tally.sent.fetch_add(1, Ordering::Relaxed);
        let i = ctx.next_url.fetch_add(1, Ordering::Relaxed) as usize % ctx.cfg.urls.len();
        let res = sign(
            ctx.client
                .post(format!("{}/hooks/{}", ctx.cfg.urls[i], src.name)),
            src,
            id,
            &body,
        )
        .header("Content-Type", "application/json")
        .body(body.clone())
        .send()
        .await;
        let disk = usize::from(ctx.disk.load(Ordering::SeqCst));
        let t = &ctx.tally;
        match res {
            Ok(r) if r.status().is_success() => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                if status == 200 {
                    t.ok_200.fetch_add(1, Ordering::Relaxed);
                } else {
                    t.ok_other_2xx.fetch_add(1, Ordering::Relaxed);
                }
                if text.contains("duplicate") {
                    t.duplicate_answers.fetch_add(1, Ordering::Relaxed);
                }
                let at = ctx.started.elapsed().as_secs_f64();
                let a = Acked {
                    id: id.to_string(),
                    source: src.name.clone(),
                    key: key.to_string(),
                    seq,
                    at_s: at,
                };
                {
                    let mut log = lock(&ctx.log);
                    // Best effort: the record that matters is in memory.
                    let _ = writeln!(
                        log,
                        r#"{{"at_s":{at:.3},"id":"{id}","source":"{}","key":"{key}","seq":{seq},"status":{status}}}"#,
                        src.name
                    );
                }
                lock(&ctx.acked).push(a);
                return;
            }
            Ok(r) => {
                let status = r.status().as_u16();
                if status == 503 {
                    if r.headers().contains_key("retry-after") {
                        t.s503_retry_after[disk].fetch_add(1, Ordering::Relaxed);
                    } else {
                        t.s503_bare[disk].fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    *lock(&t.other_status).entry(status).or_insert(0) += 1;
                }
            }
            Err(e) if e.is_connect() => {
                t.refused[disk].fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.is_timeout() => {
                t.timeouts[disk].fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                t.other_errors[disk].fetch_add(1, Ordering::Relaxed);
            }
        }
        if Instant::now() >= until {
            t.abandoned.fetch_add(1, Ordering::Relaxed);
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The global rate: one slot every 1/rate seconds, shared by every key.
async fn take_slot(ctx: &Ctx) {
    let at = {
        let mut next = lock(&ctx.bucket);
        let now = Instant::now();
        let at = (*next).max(now);
        *next = at + Duration::from_secs_f64(1.0 / ctx.cfg.rate_per_s);
        at
    };
    tokio::time::sleep_until(at.into()).await;
}

fn hmac256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("hmac key");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

fn sign(
    rb: reqwest::RequestBuilder,
    src: &SourceLoad,
    id: &str,
    body: &str,
) -> reqwest::RequestBuilder {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        .to_string();
    match &src.scheme {
        Scheme::HexSha256 { header } => rb.header(
            *header,
            format!(
                "sha256={}",
                hex::encode(hmac256(&src.key, &[body.as_bytes()]))
            ),
        ),
        Scheme::StandardWebhooks => {
            let mac = hmac256(
                &src.key,
                &[id.as_bytes(), b".", now.as_bytes(), b".", body.as_bytes()],
            );
            rb.header("webhook-id", id)
                .header("webhook-timestamp", &now)
                .header("webhook-signature", format!("v1,{}", STANDARD.encode(mac)))
        }
        Scheme::Timestamped { header } => {
            let mac = hmac256(&src.key, &[now.as_bytes(), b".", body.as_bytes()]);
            rb.header(*header, format!("t={now},v1={}", hex::encode(mac)))
        }
    }
}
