//! The one Prometheus text renderer (exposition format 0.0.4) every `/metrics` family goes
//! through: the dispatcher gauges computed from the tables, the intake's counters and its
//! connection figures, and the histograms (issue 35): attempt duration, intake request
//! duration, receive-to-delivered. One escaper, one number format, one histogram shape.
//!
//! A [`Histograms`] is a set of histograms by label values with the webhook buckets
//! [`BUCKETS_S`]; it serialises to JSON so the dispatcher can publish its histograms with
//! its heartbeat and the intake can render them.
//!
//! Must not: put anything but names and numbers in a label (callers pass configured names
//! and fixed vocabulary only).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Histogram upper bounds in seconds, chosen for webhooks: a fast receiver answers in a few
/// milliseconds, a slow one or a script in seconds, and the longest delivery timeout is a
/// minute. `+Inf` is implied.
pub const BUCKETS_S: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// A family's type line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// Label pairs, in the order they are written.
pub type Labels = Vec<(&'static str, String)>;

/// One histogram: counts per bucket of [`BUCKETS_S`] (not cumulative; the last is `+Inf`),
/// the sum of the observations and their count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn observe(&mut self, v: f64) {
        if self.buckets.len() != BUCKETS_S.len() + 1 {
            self.buckets = vec![0; BUCKETS_S.len() + 1];
        }
        let i = BUCKETS_S
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(BUCKETS_S.len());
        self.buckets[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// The cumulative count at or below each bound of [`BUCKETS_S`], then `+Inf`.
    pub fn cumulative(&self) -> Vec<u64> {
        let mut acc = 0;
        (0..=BUCKETS_S.len())
            .map(|i| {
                acc += self.buckets.get(i).copied().unwrap_or(0);
                acc
            })
            .collect()
    }
}

/// Histograms by label values (in the order of `names`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Histograms {
    pub names: Vec<String>,
    pub series: BTreeMap<String, (Vec<String>, Histogram)>,
}

impl Histograms {
    pub fn new(names: &[&str]) -> Histograms {
        Histograms {
            names: names.iter().map(|n| n.to_string()).collect(),
            series: BTreeMap::new(),
        }
    }

    /// Observe `v` seconds for the label values `values` (one per name).
    pub fn observe(&mut self, values: &[&str], v: f64) {
        let key = values.join("\u{1f}");
        self.series
            .entry(key)
            .or_insert_with(|| {
                (
                    values.iter().map(|s| s.to_string()).collect(),
                    Histogram::default(),
                )
            })
            .1
            .observe(v);
    }
}

/// A metric family: name, help, type and samples.
#[derive(Debug, Clone)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Labels, f64)>,
    histograms: Vec<(Vec<(String, String)>, Histogram)>,
}

impl Family {
    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind: Kind::Gauge,
            samples: Vec::new(),
            histograms: Vec::new(),
        }
    }

    /// A counter; its name ends in `_total`.
    pub fn counter(name: &'static str, help: &'static str) -> Family {
        Family {
            kind: Kind::Counter,
            ..Family::gauge(name, help)
        }
    }

    /// A histogram family over `h`'s series.
    pub fn histogram(name: &'static str, help: &'static str, h: &Histograms) -> Family {
        let histograms = h
            .series
            .values()
            .map(|(values, hist)| {
                let labels = h
                    .names
                    .iter()
                    .cloned()
                    .zip(values.iter().cloned())
                    .collect();
                (labels, hist.clone())
            })
            .collect();
        Family {
            kind: Kind::Histogram,
            histograms,
            ..Family::gauge(name, help)
        }
    }

    pub fn add(&mut self, labels: Labels, value: f64) {
        self.samples.push((labels, value));
    }

    /// Append one sample with no labels and return the family.
    pub fn with(mut self, value: f64) -> Family {
        self.add(vec![], value);
        self
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn render(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind.as_str());
        for (labels, value) in &self.samples {
            let pairs: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            sample(out, self.name, "", &pairs, None, *value);
        }
        for (labels, h) in &self.histograms {
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let cumulative = h.cumulative();
            for (i, n) in cumulative.iter().enumerate() {
                let le = BUCKETS_S.get(i).map_or("+Inf".to_string(), |b| number(*b));
                sample(out, self.name, "_bucket", &pairs, Some(&le), *n as f64);
            }
            sample(out, self.name, "_sum", &pairs, None, h.sum);
            sample(out, self.name, "_count", &pairs, None, h.count as f64);
        }
    }
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    v: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if !parts.is_empty() {
        out.push('{');
        out.push_str(&parts.join(","));
        out.push('}');
    }
    let _ = writeln!(out, " {}", number(v));
}

/// Render families in order.
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families {
        f.render(&mut out);
    }
    out
}

/// Label values escape backslash, double quote and newline (exposition format).
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value: integers without a fraction, NaN and the infinities as the format spells them.
pub fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
#[path = "prom_tests.rs"]
mod tests;
