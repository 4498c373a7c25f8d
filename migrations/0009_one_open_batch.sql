-- hookspool schema 9: "one open batch per (route, key)" stated by the schema (issue 30).
-- The join rule has always kept it (the enqueue transaction finds the group's open batch or
-- opens one) and `check` has reported a breach; now a write that would break it fails its
-- transaction instead. The index holds one entry per group that is filling, and a batch
-- leaves it once, when it is sealed: later state changes neither read nor write it.
--
-- A spool that broke the rule before (none is known) is repaired in the same transaction
-- before this runs: every open batch of a group but the newest is sealed as of its last
-- event (store::migrate::seal_extra_open_tx), so each is delivered in FIFO order.
CREATE UNIQUE INDEX batches_open_group ON batches (route, key) WHERE state = 'open';
-- The join rule's lookup (a group's open batch) is served by the unique index now; schema
-- 5's `batches_open` (route, key, state) indexed the same rows, and keeping both would write
-- two entries for every batch opened and two more when it is sealed.
DROP INDEX batches_open;
