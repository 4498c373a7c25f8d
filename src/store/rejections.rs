//! The intake's rejections, per hour by (source, reason) (issue 31: the dashboard's
//! "rejections by reason"). The intake counts in memory and hands its counts to
//! [`add_rejections_tx`] inside its group transaction, or to [`Store::add_rejections`] in a
//! transaction of their own when nothing has committed for a while; the admin service, a
//! separate process, reads them ([`Store::rejections_since`]); retention forgets old hours.
//!
//! Must not: hold anything but a configured source's name, a reason from the intake's fixed
//! vocabulary, an hour and a count (never a body, a header value or a query string).

use super::{Result, Store};

/// The width of one row's hour, in seconds.
pub const REJECTION_HOUR_S: i64 = 3600;

/// Requests of one source answered without being stored for one reason, within one hour.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct RejectionCount {
    /// The Unix second the hour began (a multiple of `REJECTION_HOUR_S`).
    pub hour: i64,
    pub source: String,
    pub reason: String,
    pub count: i64,
}

/// The hour `t` (Unix seconds) falls in.
pub fn rejection_hour(t: f64) -> i64 {
    (t / REJECTION_HOUR_S as f64).floor() as i64 * REJECTION_HOUR_S
}

/// Add `counts` to the rows of their hours, inside the caller's transaction.
pub(super) fn add_rejections_tx(
    tx: &super::db::Connection,
    counts: &[RejectionCount],
) -> Result<()> {
    for c in counts.iter().filter(|c| c.count > 0) {
        tx.prepare_cached(
            "INSERT INTO rejections (hour, source, reason, count) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (hour, source, reason) DO UPDATE SET count = rejections.count + excluded.count",
        )?
        .execute(rusqlite::params![c.hour, c.source, c.reason, c.count])?;
    }
    Ok(())
}

impl Store {
    /// Add `counts` in a transaction of their own: the intake's flush when no group has
    /// committed them.
    pub fn add_rejections(&mut self, counts: &[RejectionCount]) -> Result<()> {
        if counts.is_empty() {
            return Ok(());
        }
        let tx = self.begin()?;
        add_rejections_tx(&tx, counts)?;
        tx.commit()
    }

    /// The counts of the hours that began at or after the hour `from` falls in, summed over
    /// those hours: (source, reason, count), by source then reason.
    pub fn rejections_since(&self, from: f64) -> Result<Vec<(String, String, i64)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT source, reason, sum(count) FROM rejections WHERE hour >= ?1
             GROUP BY source, reason ORDER BY source, reason",
        )?;
        let rows = stmt
            .query_map([rejection_hour(from)], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testutil::temp_store;

    fn c(hour: i64, source: &str, reason: &str, count: i64) -> RejectionCount {
        RejectionCount {
            hour,
            source: source.into(),
            reason: reason.into(),
            count,
        }
    }

    /// Counts of the same hour, source and reason add up; the hours before `from`'s are
    /// left out of the sums.
    fn counts_add_up_per_hour_and_sum_from_an_hour() {
        let (_d, mut st) = temp_store();
        assert_eq!(rejection_hour(7_199.9), 3_600);
        assert_eq!(rejection_hour(7_200.0), 7_200);
        st.add_rejections(&[
            c(3_600, "gh", "unverified", 2),
            c(7_200, "gh", "unverified", 1),
        ])
        .unwrap();
        st.add_rejections(&[
            c(7_200, "gh", "unverified", 4),
            c(7_200, "gh", "too_large", 1),
            c(7_200, "stripe", "unverified", 3),
        ])
        .unwrap();
        assert_eq!(
            st.rejections_since(0.0).unwrap(),
            vec![
                ("gh".to_string(), "too_large".to_string(), 1),
                ("gh".to_string(), "unverified".to_string(), 7),
                ("stripe".to_string(), "unverified".to_string(), 3),
            ]
        );
        // From inside the second hour: that hour whole, not the first.
        assert_eq!(
            st.rejections_since(7_300.0).unwrap(),
            vec![
                ("gh".to_string(), "too_large".to_string(), 1),
                ("gh".to_string(), "unverified".to_string(), 5),
                ("stripe".to_string(), "unverified".to_string(), 3),
            ]
        );
        assert!(st.rejections_since(10_800.0).unwrap().is_empty());
    }

    /// The writer's group carries the counts: they commit with its requests, and a group
    /// whose transaction fails keeps neither (the writer then gives the counts back).
    fn a_group_transaction_carries_the_counts_or_nothing() {
        use crate::store::tests::req;
        let (_d, mut st) = temp_store();
        let out = st
            .enqueue_group(&[req("r", "k", "{}", 10.0)], &[c(0, "gh", "unverified", 2)])
            .unwrap();
        assert!(out[0].is_ok());
        let kept = vec![("gh".to_string(), "unverified".to_string(), 2)];
        assert_eq!(st.rejections_since(0.0).unwrap(), kept);
        // A count the schema refuses (its hour is no hour's start) fails the transaction.
        assert!(
            st.enqueue_group(
                &[req("r", "k2", "{}", 11.0)],
                &[c(5, "gh", "unverified", 1)]
            )
            .is_err()
        );
        assert_eq!(st.rejections_since(0.0).unwrap(), kept);
        let batches = st
            .list_batches(&crate::store::BatchFilter {
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(batches.len(), 1, "the failed group's request was not kept");
    }

    /// Retention forgets an hour once it ended `REJECTIONS_KEEP_S` ago, and not before.
    fn retention_forgets_hours_that_ended_a_week_ago() {
        let (_d, mut st) = temp_store();
        let keep = crate::store::REJECTIONS_KEEP_S;
        st.add_rejections(&[c(0, "gh", "unverified", 1), c(3_600, "gh", "unverified", 2)])
            .unwrap();
        let r = crate::store::Retention::default();
        assert_eq!(st.prune(keep + 3_599.0, &r).unwrap().rejection_hours, 0);
        assert_eq!(st.prune(keep + 3_600.0, &r).unwrap().rejection_hours, 1);
        assert_eq!(
            st.rejections_since(0.0).unwrap(),
            vec![("gh".to_string(), "unverified".to_string(), 2)]
        );
    }
    crate::store::testutil::both_backends!(
        counts_add_up_per_hour_and_sum_from_an_hour,
        a_group_transaction_carries_the_counts_or_nothing,
        retention_forgets_hours_that_ended_a_week_ago,
    );
}
