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

-- A writer that does not know the column (a binary older than this schema, still running
-- on another host while the hosts are upgraded one by one: a process checks the schema
-- when it starts) changes an open batch's events without setting open_hash back to NULL.
-- Every such change also writes the batch's count, bytes or last_at, so this trigger
-- forgets the hash whenever one of them changes on an open batch that has one, whoever
-- writes it; hookspool's own writes set it to NULL themselves as well.
CREATE FUNCTION batches_forget_open_hash() RETURNS trigger
    LANGUAGE plpgsql
AS $body$
BEGIN
    NEW.open_hash := NULL;
    RETURN NEW;
END
$body$;
CREATE TRIGGER batches_open_hash_forgotten
    BEFORE UPDATE OF count, bytes, last_at ON batches
    FOR EACH ROW
    WHEN (OLD.state = 'open' AND OLD.open_hash IS NOT NULL
          AND (NEW.count, NEW.bytes, NEW.last_at)
              IS DISTINCT FROM (OLD.count, OLD.bytes, OLD.last_at))
    EXECUTE FUNCTION batches_forget_open_hash();
