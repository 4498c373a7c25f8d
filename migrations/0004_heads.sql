-- hookspool schema 4: the head of each group found through an index (issue 13).
-- first_event_id is the smallest events.id of the batch (set when its first event joins it,
-- and by split for each part); the head of a group is its unfinished batch with the
-- smallest first_event_id, so it is the first entry of batches_heads for (route, key).
ALTER TABLE batches ADD COLUMN first_event_id INTEGER;
UPDATE batches SET first_event_id = (SELECT min(e.id) FROM events e WHERE e.batch_id = batches.id);
CREATE INDEX batches_heads ON batches (route, key, first_event_id)
    WHERE state IN ('open', 'sealed', 'retry', 'leased');
