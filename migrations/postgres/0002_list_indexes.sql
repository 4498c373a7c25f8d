-- SQLite schema 10 (migrations/0010_list_indexes.sql): the admin API's batches query, a
-- page of "filter AND id < ? ORDER BY id DESC LIMIT n". A received-between filter reads
-- `batches_first_at`; the dead letters and the dropped are walked in id order down
-- `batches_terminal`, partial so that a batch enters it only when it dies or is dropped.
-- SQLite's index entries carry the rowid (batches.id) after the indexed columns; here id
-- is spelled out so that the entries are in the same (state, id) order.
CREATE INDEX batches_first_at ON batches (first_at);
CREATE INDEX batches_terminal ON batches (state, id) WHERE state IN ('dead', 'dropped');
