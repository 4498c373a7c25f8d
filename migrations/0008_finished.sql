-- hookspool schema 8: the heads index keyed on a finished flag instead of the state (issue 13).
-- `batches_heads` holds the unfinished batches (spec 6.1: open, sealed, retry, leased). With
-- `state` in its WHERE, every state change between two unfinished states rewrote the entry
-- (SQLite updates a partial index whenever a column its WHERE reads is written), so a claim
-- (sealed -> leased) dirtied the group's heads leaf in one tick and its mark dirtied it again
-- in the next. On a backlog of few keys those leaves are one per key, and the heads index
-- was half of the pages each tick's commit wrote (bench/README.md, 2026-12-03).
--
-- `finished` is 1 exactly when the batch is delivered, dead or dropped; the CHECK keeps it
-- so on every write, so a statement that forgets it fails instead of corrupting the FIFO.
-- It defaults to 1 because that is what the rows written before this migration read without
-- being rewritten (most of a spool is finished history); the unfinished ones, found through
-- the old index, are set to 0, and every INSERT of an unfinished batch writes 0.
ALTER TABLE batches ADD COLUMN finished INTEGER NOT NULL DEFAULT 1;
UPDATE batches SET finished = 0
    WHERE state = 'open' OR state = 'sealed' OR state = 'retry' OR state = 'leased';
-- The CHECK is added in place (as in schema 7): ALTER TABLE ADD COLUMN would test it against
-- the rows before the UPDATE above could set them. Every row satisfies it now.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql,
    'finished INTEGER NOT NULL DEFAULT 1',
    'finished INTEGER NOT NULL DEFAULT 1 CHECK (finished = (state = ''delivered'' OR state = ''dead'' OR state = ''dropped''))')
    WHERE type = 'table' AND name = 'batches';
PRAGMA writable_schema = RESET;
DROP INDEX batches_heads;
CREATE INDEX batches_heads ON batches (route, key, first_event_id) WHERE finished = 0;
