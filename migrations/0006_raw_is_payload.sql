-- hookspool schema 6: a raw body identical to the payload is stored once (issue 13).
-- Most webhooks are a JSON object whose text the intake now stores as the payload as
-- received, so with store_raw = true the same bytes were written twice: two copies of a
-- 1 KiB body do not fit in one 4 KiB page with their row. raw_is_payload = 1 means the
-- original body is the payload's bytes, and raw is NULL; every reader of the original
-- body takes `CASE WHEN raw_is_payload = 1 THEN CAST(payload AS BLOB) ELSE raw END`.
-- Adding a column with a constant default rewrites no row.
ALTER TABLE events ADD COLUMN raw_is_payload INTEGER NOT NULL DEFAULT 0
    CHECK (raw_is_payload IN (0, 1));
