-- hookspool schema 10: two indexes for the admin API's batches query (issue 31), which
-- reads "filter AND id < ? ORDER BY id DESC LIMIT n" and must answer a page of 100 within
-- 50 ms on a spool of a million batches.
--
-- A received-between filter (since/until) is read through `batches_first_at`: a batch's
-- first_at is set when it opens and never changes, so the entry is written once, at the
-- right edge of the index, and deleted with the batch. A window holding few batches is
-- read from it (its entries carry the rowid, which is batches.id) and sorted by id; a wide
-- one is read in id order like any other filter.
CREATE INDEX batches_first_at ON batches (first_at);
-- The dead letters (and the dropped) are rare among a spool's batches, so reading them in id
-- order from the table means reading past every delivered batch. This index holds only
-- them, ordered by (state, id), so "state = 'dead' AND id < ? ORDER BY id DESC" is a walk
-- down one range of it. Partial, so the intake's new batches and the dispatcher's
-- open -> sealed -> leased -> delivered transitions neither read nor write it: a batch
-- enters it once, when it dies or is dropped.
CREATE INDEX batches_terminal ON batches (state) WHERE state IN ('dead', 'dropped');
