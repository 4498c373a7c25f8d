//! The SQL edge of the shared vocabulary (`crate::vocab`): each enum is stored as its word
//! and read back through `parse`, so a column holding a word this build does not know is a
//! typed error at the read, never a string that a later `match` misreads. Must not: hold
//! any rule about what the words mean.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use crate::vocab::{AttemptOutcome, BatchState, BreakerState, Klass};

macro_rules! stored_as_word {
    ($($name:ident),+) => {$(
        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $name {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<$name> {
                let text = value.as_str()?;
                $name::parse(text).ok_or_else(|| {
                    FromSqlError::Other(
                        format!("unknown {} {text:?} in the database", stringify!($name)).into(),
                    )
                })
            }
        }
    )+};
}

stored_as_word!(AttemptOutcome, BatchState, BreakerState, Klass);
