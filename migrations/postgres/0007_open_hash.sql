-- The equivalent of SQLite schema 12 (migrations/0012_open_hash.sql, which says what the
-- column holds): `open_hash`, the content hash of an open batch's events as they stand,
-- stored by the intake that opened the batch and set back to NULL by whatever changes its
-- events afterwards, in the statement that writes the batch's row. The seal's find
-- (SEAL_READY_EVENTS_PG_SQL in src/store/delivery.rs) locks the ready open batches and seals
-- each whose open_hash is set with that hash in the same statement. Because every change to
-- a batch's events writes its row, the row PostgreSQL returns once the lock is held (after
-- an intake that joined the batch meanwhile committed) carries open_hash NULL, and that
-- batch's events are read and hashed instead.
ALTER TABLE batches ADD COLUMN open_hash text;
