//! The SQL edge of the shared vocabulary (`crate::vocab`): each enum is stored as its word
//! and read back through `parse`, so a column holding a word this build does not know is a
//! typed error at the read, never a string that a later `match` misreads. Must not: hold
//! any rule about what the words mean.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use crate::vocab::{AttemptOutcome, BatchState, BreakerState, Klass};

fn word(text: &'static str) -> rusqlite::Result<ToSqlOutput<'static>> {
    Ok(ToSqlOutput::from(text))
}

fn read<T>(value: ValueRef<'_>, parse: fn(&str) -> Option<T>, what: &str) -> FromSqlResult<T> {
    let text = value.as_str()?;
    parse(text).ok_or_else(|| {
        FromSqlError::Other(format!("unknown {what} {text:?} in the database").into())
    })
}

impl ToSql for BatchState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        word(self.as_str())
    }
}

impl FromSql for BatchState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<BatchState> {
        read(value, BatchState::parse, "batch state")
    }
}

impl ToSql for BreakerState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        word(self.as_str())
    }
}

impl FromSql for BreakerState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<BreakerState> {
        read(value, BreakerState::parse, "destination state")
    }
}

impl ToSql for Klass {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        word(self.as_str())
    }
}

impl FromSql for Klass {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Klass> {
        read(value, Klass::parse, "outcome class")
    }
}

impl ToSql for AttemptOutcome {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        word(self.as_str())
    }
}

impl FromSql for AttemptOutcome {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<AttemptOutcome> {
        read(value, AttemptOutcome::parse, "attempt outcome")
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::temp_store;
    use crate::vocab::BatchState;

    #[test]
    fn an_unknown_word_in_a_column_is_an_error_not_a_guess() {
        let (_d, s) = temp_store();
        let ok: BatchState = s
            .conn
            .query_row("SELECT 'delivered'", (), |r| r.get(0))
            .unwrap();
        assert_eq!(ok, BatchState::Delivered);
        let bad = s
            .conn
            .query_row("SELECT 'Delivered'", (), |r| r.get::<_, BatchState>(0));
        assert!(bad.is_err(), "{bad:?}");
    }
}
