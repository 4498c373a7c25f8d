//! observe::prom's tests (the renderer, the histograms' JSON round trip, the escaper).

use super::*;

#[test]
fn a_histogram_renders_cumulative_buckets_sum_and_count() {
    let mut h = Histograms::new(&["destination", "outcome"]);
    h.observe(&["a\"b", "ok"], 0.004);
    h.observe(&["a\"b", "ok"], 0.3);
    h.observe(&["a\"b", "ok"], 100.0);
    let text = render(&[Family::histogram("x_seconds", "X.", &h)]);
    assert!(text.contains("# TYPE x_seconds histogram\n"), "{text}");
    assert!(
        text.contains("x_seconds_bucket{destination=\"a\\\"b\",outcome=\"ok\",le=\"0.005\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("le=\"0.25\"} 1\n"), "{text}");
    assert!(text.contains("le=\"0.5\"} 2\n"), "{text}");
    assert!(text.contains("le=\"60\"} 2\n"), "{text}");
    assert!(text.contains("le=\"+Inf\"} 3\n"), "{text}");
    assert!(
        text.contains("x_seconds_sum{destination=\"a\\\"b\",outcome=\"ok\"} 100.304"),
        "{text}"
    );
    assert!(
        text.contains("x_seconds_count{destination=\"a\\\"b\",outcome=\"ok\"} 3\n"),
        "{text}"
    );
}

#[test]
fn histograms_survive_json() {
    let mut h = Histograms::new(&["route"]);
    h.observe(&["r"], 1.5);
    let back: Histograms =
        serde_json::from_str(&serde_json::to_string(&h).expect("json")).expect("parse");
    let a = render(&[Family::histogram("y_seconds", "Y.", &h)]);
    let b = render(&[Family::histogram("y_seconds", "Y.", &back)]);
    assert_eq!(a, b);
}

#[test]
fn labels_escape_and_gauges_render() {
    let mut f = Family::gauge("g", "G.");
    f.add(vec![("d", "x\\y\nz".into())], 2.0);
    let text = render(&[f, Family::counter("c_total", "C.").with(3.0)]);
    assert!(text.contains("g{d=\"x\\\\y\\nz\"} 2\n"), "{text}");
    assert!(
        text.contains("# TYPE c_total counter\nc_total 3\n"),
        "{text}"
    );
}
